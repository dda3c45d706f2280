"""Tensor parallelism: one process per device, each holding a shard of every layer.

What each rank holds is :mod:`.sharding`'s business; this module runs the group. Rank 0 is the
engine (scheduler, block manager, sampler). It starts ranks 1..N-1 (:mod:`.tp_worker`), which
only run the model, and each step broadcasts the step's inputs to them as one int64 tensor
behind a fixed-size header (:class:`StepChannel`). Every rank's KV cache holds its own KV
heads under the same block tables.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ...child import EXIT_GRACE_S, exit_description, reap_blocking, start
from ..ops.metadata import AttentionMetadata
from .step_inputs import StepArrays, step_tensors

log = logging.getLogger("lmiserve.engine")

TIMEOUT = datetime.timedelta(minutes=30)
"""How long a rank waits to join the group, or in one collective, before it gives up."""


class TensorParallelError(RuntimeError):
    """A rank failed: the engine cannot continue (the server restarts it)."""


# --- devices and the process group ----------------------------------------------------------
def backend_for(device: str) -> str:
    if device.startswith("cuda"):
        return "nccl"
    if device.startswith("npu"):
        return "hccl"
    return "gloo"


def _split(device: str) -> tuple[str, int]:
    kind, _, index = device.partition(":")
    return kind, int(index or 0)


def device_count(kind: str) -> int:
    if kind == "cuda":
        return torch.cuda.device_count()
    if kind == "npu":
        import torch_npu  # noqa: F401 - registers torch.npu

        return int(torch.npu.device_count())  # type: ignore[attr-defined]
    return 1


def rank_device(device: str, rank: int) -> str:
    """Rank ``r`` runs on the r-th device after the configured one (all on the CPU on a CPU)."""
    kind, first = _split(device)
    return device if kind == "cpu" else f"{kind}:{first + rank}"


def resolve_degree(value: int | str, device: str) -> int:
    """``option.tensor_parallel_degree`` as a number: ``max`` is every visible device (1 on a CPU)."""
    if value != "max":
        return int(value)
    kind, first = _split(device)
    if kind == "cpu":
        log.info("tensor_parallel_degree max on a CPU means 1 (one process); give a number to shard across sockets")
        return 1
    count = max(1, device_count(kind) - first)
    log.info("tensor_parallel_degree max: %d %s device(s) from %s", count, kind, device)
    return count


def check_devices(device: str, world: int) -> None:
    kind, first = _split(device)
    if kind == "cpu" or world == 1:
        return
    visible = device_count(kind)
    if first + world > visible:
        raise ValueError(
            f"tensor_parallel_degree {world} needs {world} {kind} devices from {device}; {visible} are visible"
        )


def rank_threads(world: int) -> int:
    """CPU threads per rank: the CPUs this process may use, shared evenly."""
    return max(1, len(os.sched_getaffinity(0)) // world)


def use_device(device: str) -> None:
    kind, _ = _split(device)
    if kind == "cuda":
        torch.cuda.set_device(device)
    elif kind == "npu":
        import torch_npu  # noqa: F401 - registers torch.npu and the hccl backend

        torch.npu.set_device(device)  # type: ignore[attr-defined]


def join_group(store: dist.Store, rank: int, world: int, device: str) -> None:
    use_device(device)
    dist.init_process_group(backend_for(device), store=store, rank=rank, world_size=world, timeout=TIMEOUT)


def agree_min(value: int, device: str) -> int:
    """The smallest of every rank's ``value`` (e.g. KV blocks that fit on every device)."""
    t = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


# --- the per-step broadcast --------------------------------------------------------------
_STOP, _STEP = 0, 1
# kind, tokens, sequences, decodes, block-table width, block copies, payload length, whether the
# prompt lengths follow (a step whose prompt chunks hold generated tokens)
_HEADER = 8

StepInputs = tuple[torch.Tensor, torch.Tensor, AttentionMetadata, tuple[torch.Tensor, torch.Tensor] | None]
"""input ids, positions, attention metadata and the block copies (sources, destinations) of a step."""


class StepChannel:
    """Rank 0 sends each step's inputs; every other rank receives them.

    Two broadcasts per step: a fixed header with the sizes, then one int64 tensor with the
    step's arrays (:class:`StepArrays`) and block copies back to back. Every rank then makes its
    step tensors from the same arrays, as a single process does.
    """

    def __init__(self, device: str):
        self.device = device
        self._header = torch.zeros(_HEADER, dtype=torch.long, device=device)
        self.broken: str | None = None
        """Set on rank 0 when a step failed once sent: the ranks are out of step from then on."""

    def send(self, arrays: StepArrays, copies: list[tuple[int, int]]) -> StepInputs:
        flat = np.asarray(copies, dtype=np.int64).T.ravel() if copies else np.zeros(0, dtype=np.int64)
        payload = np.concatenate(
            [
                arrays.input_ids,
                arrays.positions,
                arrays.slots,
                arrays.block_tables.ravel(),
                arrays.cu_q_lens,
                arrays.seq_lens,
                flat,
                arrays.prompt_lens if arrays.prompt_lens is not None else np.zeros(0, dtype=np.int64),
            ],
            dtype=np.int64,
        )
        s, w = arrays.block_tables.shape
        has_lens = int(arrays.prompt_lens is not None)
        header = [_STEP, arrays.num_tokens, s, arrays.num_decodes, w, len(copies), payload.shape[0], has_lens]
        dist.broadcast(torch.tensor(header, dtype=torch.long, device=self.device), 0)
        dist.broadcast(torch.from_numpy(payload).to(self.device), 0)
        return self._inputs(arrays, flat, len(copies))

    def recv(self) -> StepInputs | None:
        """The next step's inputs, or None when rank 0 stops the ranks."""
        dist.broadcast(self._header, 0)
        header = self._header.tolist()
        if header[0] == _STOP:
            return None
        _, t, s, nd, w, ncopies, size, has_lens = header
        data = torch.empty(size, dtype=torch.long, device=self.device)
        dist.broadcast(data, 0)
        values = data.cpu().numpy()
        bounds = np.cumsum([0, t, t, t, s * w, s + 1, s, 2 * ncopies, s * has_lens])
        part = [values[a:b] for a, b in zip(bounds, bounds[1:])]
        arrays = StepArrays(
            input_ids=part[0],
            positions=part[1],
            slots=part[2],
            block_tables=part[3].astype(np.int32).reshape(s, w),
            cu_q_lens=part[4].astype(np.int32),
            seq_lens=part[5].astype(np.int32),
            num_decodes=nd,
            prompt_lens=part[7].astype(np.int32) if has_lens else None,
        )
        return self._inputs(arrays, part[6], ncopies)

    def _inputs(self, arrays: StepArrays, copies: np.ndarray, ncopies: int) -> StepInputs:
        ids, positions, meta = step_tensors(arrays, self.device)
        block_copies = None
        if ncopies:
            both = torch.from_numpy(np.ascontiguousarray(copies)).to(self.device)
            block_copies = (both[:ncopies], both[ncopies:])
        return ids, positions, meta, block_copies

    def stop(self) -> None:
        dist.broadcast(torch.zeros(_HEADER, dtype=torch.long, device=self.device), 0)


# --- ranks 1..N-1, seen from rank 0 -------------------------------------------------------
class WorkerRanks:
    """Starts ranks 1..N-1 (``python -m lmiserve.rolling_batch.runner.tp_worker``) and watches them.

    A rank that exits while the engine runs is fatal: ``on_failure`` is called with the reason
    (the engine process exits, so the server restarts the engine); without it, the other
    ranks are stopped and the next step raises :class:`TensorParallelError`.
    """

    def __init__(self, config: dict[str, Any], world: int, device: str, on_failure: Callable[[str], None] | None):
        self.world = world
        self.device = device
        self.on_failure = on_failure
        self.failure: str | None = None
        self.channel: StepChannel | None = None
        self._armed = False
        self._closing = False
        self._threads = torch.get_num_threads()
        if device == "cpu":
            torch.set_num_threads(rank_threads(world))
        self.store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
        command = [
            sys.executable,
            "-m",
            "lmiserve.rolling_batch.runner.tp_worker",
            "--port",
            str(self.store.port),
            "--world-size",
            str(world),
            "--parent",
            str(os.getpid()),
            "--log-level",
            logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower(),
            "--config",
            json.dumps(config, default=str),
        ]
        self.procs = [start([*command, "--rank", str(rank)]) for rank in range(1, world)]
        log.info(
            "tensor parallel: %d ranks, %s backend; ranks 1..%d are pids %s",
            world,
            backend_for(device),
            world - 1,
            self.pids,
        )
        for rank, proc in enumerate(self.procs, 1):
            threading.Thread(target=self._watch, args=(rank, proc), name=f"tp-rank-{rank}", daemon=True).start()

    @property
    def pids(self) -> str:
        return ",".join(str(p.pid) for p in self.procs)

    def _watch(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        if self._closing:
            return
        self.failure = f"tensor-parallel rank {rank} (pid {proc.pid}) exited {exit_description(code)}"
        log.error("%s; the engine cannot continue", self.failure)
        for other in self.procs:  # a rank waiting in a collective with the dead one gets an error
            if other.poll() is None:
                other.kill()
        if self._armed and self.on_failure is not None:
            self.on_failure(self.failure)

    def check(self) -> None:
        """Raise if the group cannot run another step (a rank died, or a step failed half-way)."""
        if self.failure is not None:
            raise TensorParallelError(self.failure)
        if self.channel is not None and self.channel.broken is not None:
            raise TensorParallelError(self.channel.broken)

    def join(self) -> None:
        """Wait until every rank has loaded its shard, then form the process group with them."""
        keys = [f"loaded/{rank}" for rank in range(1, self.world)]
        while not self.store.check(keys):
            if self.failure is not None:
                raise TensorParallelError(f"{self.failure} while loading the model")
            time.sleep(0.05)
        self._armed = True
        self.check()
        join_group(self.store, 0, self.world, self.device)

    def ready(self) -> StepChannel:
        """The ranks wait for steps from now on."""
        self.channel = StepChannel(self.device)
        return self.channel

    def close(self, grace: float = 2 * EXIT_GRACE_S) -> None:
        """Stop the ranks (a stop message when they are waiting for steps, else a kill)."""
        if self._closing:
            return
        self._closing = True
        if self.channel is not None and self.channel.broken is None and self.failure is None:
            try:
                self.channel.stop()
            except Exception as exc:  # noqa: BLE001 - they are killed below
                log.warning("could not stop the tensor-parallel ranks cleanly: %s", exc)
        else:
            for proc in self.procs:
                proc.kill()
        for proc in self.procs:
            reap_blocking(proc, grace)
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as exc:  # noqa: BLE001
                log.warning("destroying the tensor-parallel process group failed: %s", exc)
        torch.set_num_threads(self._threads)
