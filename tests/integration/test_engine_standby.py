"""The standby engine process (option.engine_standby) behind the real server: a killed engine is
replaced by the process that was already waiting, a standby that dies is replaced, and the
server's exit leaves none behind. Waits are bounded; nothing here asserts a timing figure."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.integration.engine_server import start

pytestmark = pytest.mark.serial


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(predicate, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def describe(c: httpx.Client) -> dict:
    return c.get("/models/tiny").json()[0]


def standby_pid(c: httpx.Client) -> int | None:
    return describe(c)["standbyPid"]


def test_killed_engine_restarts_in_the_standby_and_shutdown_ends_it(tiny_llama_dir, tmp_path):
    with start(tmp_path / "m", tiny_llama_dir, "option.engine_standby=true\n") as server:
        server.wait_ready()
        with server.client() as c:
            assert wait_for(lambda: standby_pid(c) is not None)
            first = describe(c)
            engine, standby = first["enginePid"], first["standbyPid"]
            assert standby != engine and alive(standby)

            os.kill(engine, signal.SIGKILL)
            assert wait_for(lambda: describe(c)["status"] == "Healthy" and describe(c)["enginePid"] != engine)
            assert describe(c)["enginePid"] == standby  # the waiting process became the engine
            ok = c.post("/invocations", json={"inputs": "Hi", "parameters": {"max_new_tokens": 3}})
            assert ok.status_code == 200 and ok.json()["generated_text"]

            # the next standby, started after the restart
            assert wait_for(lambda: standby_pid(c) not in (None, standby))
            replacement = standby_pid(c)
            assert alive(replacement)

            # a standby that dies while it waits is replaced, and the engine is not disturbed
            os.kill(replacement, signal.SIGKILL)
            assert wait_for(lambda: standby_pid(c) not in (None, replacement))
            last = describe(c)
            assert last["enginePid"] == standby and last["status"] == "Healthy"
            engine, standby = last["enginePid"], last["standbyPid"]
        server.stop()
    assert wait_for(lambda: not alive(standby), 30), "the standby engine process outlived the server"
    assert wait_for(lambda: not alive(engine), 30), "the engine process outlived the server"


def test_no_standby_when_turned_off(tiny_llama_dir, tmp_path):
    with start(tmp_path / "m", tiny_llama_dir, "option.engine_standby=false\n") as server:
        server.wait_ready()
        with server.client() as c:
            engine = describe(c)["enginePid"]
            time.sleep(1)
            assert standby_pid(c) is None
            os.kill(engine, signal.SIGKILL)
            assert wait_for(lambda: describe(c)["status"] == "Healthy" and describe(c)["enginePid"] != engine)
            assert standby_pid(c) is None
