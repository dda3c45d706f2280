"""option.tensor_parallel_degree behind the real server, on a tiny random Llama (4 query heads,
2 KV heads) split over two CPU processes."""

import os
import signal
import time

import pytest

from tests.integration.engine_server import Reference, start

pytestmark = pytest.mark.serial

PROMPTS = ["What is Deep Learning?", "The quick brown fox jumps over the lazy dog.", "Numbers: 1 2 3"]
BODY = {"parameters": {"max_new_tokens": 20}}


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    return Reference(tiny_llama_dir)


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    with start(tmp_path_factory.mktemp("tp") / "m", tiny_llama_dir, "option.tensor_parallel_degree=2\n") as s:
        yield s.wait_ready()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def describe(server) -> dict:
    with server.client() as c:
        return c.get("/models/tiny").json()[0]


def generate(server, prompt: str) -> str:
    with server.client() as c:
        r = c.post("/invocations", json={"inputs": prompt, **BODY})
    assert r.status_code == 200, r.text
    return r.json()["generated_text"]


def test_two_ranks_serve_what_one_process_serves(server, tiny_llama_dir, tmp_path, reference):
    engine = describe(server)["engine"]
    assert engine["tensor_parallel_degree"] == 2 and len(engine["rank_pids"].split(",")) == 1
    two = [generate(server, p) for p in PROMPTS]
    with start(tmp_path / "one", tiny_llama_dir) as one_server:
        one = [generate(one_server.wait_ready(), p) for p in PROMPTS]
    assert two == one == [reference.text(p, 20) for p in PROMPTS]


def test_a_dead_rank_restarts_the_engine(server, reference):
    before = describe(server)
    rank = int(before["engine"]["rank_pids"])
    os.kill(rank, signal.SIGKILL)
    deadline = time.monotonic() + 120
    after = before
    while time.monotonic() < deadline:  # the engine exits, the server starts it again
        after = describe(server)
        if after["status"] == "Healthy" and after["enginePid"] != before["enginePid"]:
            break
        time.sleep(0.2)
    assert after["status"] == "Healthy" and after["enginePid"] != before["enginePid"], after
    assert not alive(before["enginePid"]) and not alive(rank)
    assert after["engine"]["tensor_parallel_degree"] == 2
    assert generate(server, PROMPTS[0]) == reference.text(PROMPTS[0], 20)


def test_stopping_the_server_stops_the_ranks(tiny_llama_dir, tmp_path):
    s = start(tmp_path / "m", tiny_llama_dir, "option.tensor_parallel_degree=2\n")
    try:
        info = describe(s.wait_ready())
    finally:
        s.stop()
    pids = [info["enginePid"], int(info["engine"]["rank_pids"])]
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (
            "option.tensor_parallel_degree=2\noption.rolling_batch=disable\n",
            "option.tensor_parallel_degree > 1 needs the lmi engine (option.rolling_batch=lmi, npu or auto); "
            "option.rolling_batch=disable runs transformers generate on one device",
        ),
        (
            "option.tensor_parallel_degree=3\n",
            "num_attention_heads 4 is not divisible by tensor_parallel_degree 3; "
            "degrees this model can be split over: 1, 2, 4",
        ),
    ],
)
def test_a_degree_that_cannot_work_stops_start_up_with_one_line(tiny_llama_dir, tmp_path, extra, error):
    # serving.properties wins over the environment (DJL's precedence), so the values are in the file
    s = start(tmp_path / "m", tiny_llama_dir, extra)
    assert s.wait_exit() == 1
    s.stop()
    log = s.log()
    assert [line for line in log.splitlines() if error in line], log
    assert "Traceback" not in log
