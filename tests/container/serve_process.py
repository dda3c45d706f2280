"""``container/serve`` started outside Docker, with the environment SageMaker gives a container."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.server_process import free_port

REPO = Path(__file__).resolve().parents[2]
SERVE = REPO / "container" / "serve"


def sagemaker_env(model_dir: Path | None, port: int, **extra: str) -> dict[str, str]:
    """The variables SageMaker sets (the model directory given by SM_MODEL_DIR instead of
    /opt/ml/model), on loopback only and without the gRPC port, so that tests run side by side."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SERVING_", "SAGEMAKER_", "HF_MODEL"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `lmiserve` on PATH
    env["SM_MODEL_DIR"] = str(model_dir) if model_dir is not None else "/nonexistent/opt/ml/model"
    env["SAGEMAKER_BIND_TO_PORT"] = str(port)
    env["SERVING_HOST"] = "127.0.0.1"
    env["SERVING_GRPC_PORT"] = "0"
    env["SERVING_API_PROCESSES"] = "1"  # one API process whatever the CPUs, unless a test asks for more
    env["OPTION_ENGINE_STANDBY"] = "false"  # no standby engine process competing for the cores
    env.update(extra)
    return env


class ContainerServe:
    """``container/serve serve`` as SageMaker runs it: no flags, everything from the environment."""

    def __init__(self, model_dir: Path | None, log_dir: Path, **env: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"serve-{self.port}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(SERVE), "serve"],
            env=sagemaker_env(model_dir, self.port, **env),
            cwd=log_dir,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as in a container
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180) -> ContainerServe:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/ping", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"serve not ready after {timeout} s:\n{self.log()}")

    def client(self, timeout: float = 120) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)

    def sigterm(self) -> None:
        """What ``docker stop`` does: SIGTERM to the container's first process only."""
        self.proc.send_signal(signal.SIGTERM)

    def sigterm_group(self) -> None:
        """What a service manager or ``kill -- -PGID`` does: SIGTERM to every process of the group."""
        os.killpg(self.proc.pid, signal.SIGTERM)

    def wait_log(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{text!r} not logged within {timeout} s:\n{self.log()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

    def __enter__(self) -> ContainerServe:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_gone(pid: int, timeout: float = 15) -> bool:
    """True once no process ``pid`` exists (bounded wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False
