"""The engine client a served model starts: our engine in a child process, or vLLM."""

from __future__ import annotations

from pathlib import Path

from .. import wire
from ..child import child_env
from ..config import Settings
from ..rolling_batch.engine_config import engine_options
from ..rolling_batch.process.client import EngineClient, ProcessEngineClient
from . import engine_sockets
from .model_sources import local_draft


def engine_env(settings: Settings) -> dict[str, str]:
    """The engine process's environment: offline, and the NPU runtime's settings when it may use one."""
    env = child_env()
    # the KV pool and activations of changing shapes fragment the NPU caching allocator less this way
    env.setdefault("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True")
    ids = settings.engine.npu_device_ids
    if ids is not None:
        env["ASCEND_RT_VISIBLE_DEVICES"] = ",".join(i.strip() for i in ids.split(","))
    return env


def engine_client(settings: Settings, path: Path, backend: str) -> EngineClient:
    """The client of ``settings``' model at ``path`` on ``backend`` (not started yet)."""
    settings = local_draft(settings)
    if backend == "vllm":
        from ..rolling_batch.vllm.adapter import VllmEngineClient

        return VllmEngineClient(settings, path)
    init = wire.InitEngine(
        model_name=settings.model_name,
        model_path=str(path),
        options=engine_options(settings.model, settings.engine),
        log_level=settings.server.log_level,
        listen_path=engine_sockets.next_path(),
    )
    heartbeat = float(settings.engine.engine_heartbeat_timeout)
    return ProcessEngineClient(init, env=engine_env(settings), heartbeat_timeout=heartbeat)
