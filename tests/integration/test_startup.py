"""Start-up: configuration errors, broken model.py files, /ping while loading."""

import subprocess
import sys
import time

import httpx
import pytest

from tests.server_process import ServerProcess

pytestmark = pytest.mark.serial


def test_bad_setting_stops_startup_with_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "lmiserve", "serve", "--model-dir", str(tmp_path)],
        env={"OPTION_DTYPE": "fp64", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "lmiserve: invalid value for option.dtype: 'fp64' (set by env OPTION_DTYPE); allowed: auto, fp32, fp16, bf16"
    ]


def test_config_show_prints_sources(tmp_path):
    (tmp_path / "serving.properties").write_text("batch_size=3\n")
    proc = subprocess.run(
        [sys.executable, "-m", "lmiserve", "config", "show", "--model-dir", str(tmp_path), "--port", "9001"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines() if line.strip()}
    assert rows["batch_size"][:2] == ["3", "file"]
    assert rows["port"] == ["9001", "cli", "--port"]


def test_syntax_error_in_model_py_stops_the_server(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.py").write_text("def handle(inputs)\n    return None\n")
    server = ServerProcess(d)
    assert server.wait_exit() == 1
    server.stop()
    log = server.log()
    assert "syntax error in" in log and "model.py, line 1" in log


def test_import_error_in_model_py_stops_the_server(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.py").write_text("import no_such_module_anywhere\n\ndef handle(inputs):\n    return None\n")
    server = ServerProcess(d)
    assert server.wait_exit() == 1
    server.stop()
    assert "ModuleNotFoundError: No module named 'no_such_module_anywhere'" in server.log()


def test_ping_is_503_while_loading_then_200(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.py").write_text(
        "import time\nREADY = []\n"
        "def handle(inputs):\n"
        "    if not READY:\n        time.sleep(4)\n        READY.append(1)\n        return None\n"
        "    from lmiserve.handlers.outputs import Output\n    return Output().add('ok')\n"
    )
    with ServerProcess(d) as server:
        seen = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                r = httpx.get(server.url + "/ping", timeout=2)
                seen.append((r.status_code, r.json()))
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
    assert (503, {"m": "Loading"}) in seen
    assert seen[-1] == (200, {"m": "Healthy"})
