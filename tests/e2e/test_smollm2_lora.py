"""End to end: SmolLM2 with LoRA adapters built by ``peft``, served by the engine in fp32. Four
requests at once, for three adapters and the base model, each give exactly transformers + peft's
greedy tokens."""

import concurrent.futures
import shutil
from pathlib import Path

import pytest

from tests.lora_adapters import build_adapter, peft_greedy
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
PROMPT = "What is Deep Learning?"
N = 16


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, smollm2_dir):
    root = tmp_path_factory.mktemp("smollm2-adapters")
    return {
        "all": build_adapter(smollm2_dir, root / "all", seed=21, rank=16, scale=1.0),
        "qv": build_adapter(smollm2_dir, root / "qv", seed=22, rank=8, targets=["q_proj", "v_proj"], scale=1.0),
        "mlp": build_adapter(
            smollm2_dir, root / "mlp", seed=23, rank=16, targets=["gate_proj", "up_proj", "down_proj"], scale=1.0
        ),
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory, adapters):
    d = tmp_path_factory.mktemp("smollm2-lora")
    for name, path in adapters.items():
        shutil.copytree(path, d / "adapters" / name)
    extra = "option.dtype=fp32\noption.enable_lora=true\noption.max_loras=4\n"
    (d / "serving.properties").write_text((REPO / "serving.properties").read_text() + extra)
    with ServerProcess(d) as s:
        yield s.wait_ready(timeout=300)


def test_three_adapters_and_the_base_model_in_one_batch_equal_peft(server, adapters, smollm2_dir):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(smollm2_dir)(PROMPT)["input_ids"]
    names = ["all", "qv", "mlp", ""]
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": N, "details": True}}

    def call(name):
        with server.client() as c:
            r = c.post("/invocations", json={**body, "adapters": name})
        assert r.status_code == 200, r.text
        return [t["id"] for t in r.json()["details"]["tokens"]]

    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        got = dict(zip(names, pool.map(call, names)))
    want = {name: peft_greedy(smollm2_dir, adapters[name] if name else None, ids, N) for name in names}
    assert len({tuple(v) for v in want.values()}) == len(names), "each adapter must change the tokens"
    assert got == want
