"""LoRA adapters through the real server: DJL's Adapters Management API, each protocol's way of
naming an adapter, eviction and reload, and the refusals, on a tiny Llama whose adapters are
built with ``peft``; every answer's tokens must equal transformers + ``peft`` greedy."""

from __future__ import annotations

import shutil

import httpx
import pytest

from tests.integration.engine_server import start
from tests.lora_adapters import build_adapter, peft_greedy

PROMPT = "What is Deep Learning?"
N = 12


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, tiny_llama_dir):
    root = tmp_path_factory.mktemp("lora-adapters")
    elsewhere = tmp_path_factory.mktemp("lora-elsewhere")  # outside model_roots
    return {
        "alpha": build_adapter(tiny_llama_dir, root / "alpha", seed=1, rank=8),
        "beta": build_adapter(tiny_llama_dir, root / "beta", seed=2, rank=4, targets=["q_proj", "v_proj"]),
        "gamma": build_adapter(tiny_llama_dir, root / "gamma", seed=3, rank=16, targets=["gate_proj", "down_proj"]),
        "wide": build_adapter(tiny_llama_dir, elsewhere / "wide", seed=4, rank=32, targets=["q_proj"]),
    }


@pytest.fixture(scope="module")
def expected(tiny_llama_dir, tiny_tokenizer, adapters):
    ids = tiny_tokenizer(PROMPT)["input_ids"]
    found = {name: peft_greedy(tiny_llama_dir, path, ids, N) for name, path in adapters.items() if name != "wide"}
    found[""] = peft_greedy(tiny_llama_dir, None, ids, N)
    assert len({tuple(v) for v in found.values()}) == len(found), "each adapter must change the tokens"
    return {name: tiny_tokenizer.decode(toks, skip_special_tokens=True) for name, toks in found.items()}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_llama_dir, adapters):
    root = tmp_path_factory.mktemp("lora-server")
    (root / "m" / "adapters").mkdir(parents=True)
    for name in ("alpha", "beta"):  # found at start
        shutil.copytree(adapters[name], root / "m" / "adapters" / name)
    extra = (
        "option.enable_lora=true\noption.max_loras=2\noption.max_cpu_loras=2\noption.max_lora_rank=16\n"
        f"model_roots={root},{adapters['gamma'].parent}\n"
    )
    with start(root / "m", tiny_llama_dir, extra) as s:
        s.wait_ready()
        s.adapters = adapters
        yield s


def _lmi(server, body, **kwargs):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": N}, **body}
    return httpx.post(server.url + "/invocations", json=body, timeout=60, **kwargs)


def test_adapters_in_the_model_directory_load_at_start(server):
    listed = httpx.get(server.url + "/models/tiny/adapters").json()
    assert [a["name"] for a in listed["adapters"]] == ["alpha", "beta"]
    assert listed["adapters"][0]["preload"] is True and listed["adapters"][0]["pin"] is False
    assert httpx.get(server.url + "/adapters").json() == listed  # one model: no prefix needed


def test_lmi_names_the_adapter_in_the_body_the_header_or_the_query(server, expected):
    assert _lmi(server, {"adapters": "alpha"}).json()["generated_text"] == expected["alpha"]
    assert _lmi(server, {"adapters": ["beta"]}).json()["generated_text"] == expected["beta"]
    assert _lmi(server, {"adapters": ""}).json()["generated_text"] == expected[""]
    assert _lmi(server, {}).json()["generated_text"] == expected[""]
    header = {"X-Amzn-SageMaker-Adapter-Identifier": "beta"}
    assert _lmi(server, {"adapters": "alpha"}, headers=header).json()["generated_text"] == expected["beta"]
    r = httpx.post(
        server.url + "/invocations?adapter=alpha", json={"inputs": PROMPT, "parameters": {"max_new_tokens": N}}
    )
    assert r.json()["generated_text"] == expected["alpha"]
    assert (
        httpx.post(
            server.url + "/predictions/tiny",
            json={"inputs": PROMPT, "adapters": "alpha", "parameters": {"max_new_tokens": N}},
        ).json()["generated_text"]
        == expected["alpha"]
    )


def test_requests_for_different_adapters_share_a_batch(server, expected):
    import concurrent.futures

    names = ["alpha", "beta", "", "alpha", "beta", ""]
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        texts = list(pool.map(lambda n: _lmi(server, {"adapters": n}).json()["generated_text"], names))
    assert texts == [expected[n] for n in names]


def test_tgi_and_mindie_take_adapter_id(server, expected):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": N, "adapter_id": "beta"}}
    assert httpx.post(server.url + "/generate", json=body).json()["generated_text"] == expected["beta"]
    assert httpx.post(server.url + "/", json=body).json()[0]["generated_text"] == expected["beta"]
    body["parameters"]["adapter_id"] = "None"  # MindIE's way of naming the base model
    assert httpx.post(server.url + "/generate", json=body).json()["generated_text"] == expected[""]


def test_openai_and_databricks_name_the_adapter_as_the_model(server, expected):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    done = client.completions.create(model="alpha", prompt=PROMPT, max_tokens=N, temperature=0)
    assert done.choices[0].text == expected["alpha"] and done.model == "alpha"
    streamed = client.completions.create(model="beta", prompt=PROMPT, max_tokens=N, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == expected["beta"]
    models = {m.id: m for m in client.models.list().data}
    assert {"tiny", "alpha", "beta"} <= set(models)
    assert models["alpha"].model_extra["parent"] == "tiny"
    body = {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "use_raw_prompt": True}
    r = httpx.post(server.url + "/serving-endpoints/alpha/invocations", json=body).json()
    assert r["choices"][0]["text"] == expected["alpha"]
    r = httpx.post(server.url + "/serving-endpoints/completions", json={**body, "model": "beta"}).json()
    assert r["choices"][0]["text"] == expected["beta"]
    # an OpenAI body on /invocations: the SageMaker header names the adapter
    body = {"prompt": PROMPT, "max_tokens": N, "temperature": 0}
    r = httpx.post(server.url + "/invocations", json=body, headers={"X-Amzn-SageMaker-Adapter-Identifier": "alpha"})
    assert r.json()["choices"][0]["text"] == expected["alpha"]


def test_kserve_takes_lora_name(server, expected):
    body = {"text_input": PROMPT, "parameters": {"max_tokens": N, "lora_name": "alpha"}}
    r = httpx.post(server.url + "/v2/models/tiny/generate", json=body).json()
    assert r["text_output"] == expected["alpha"]
    infer = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [PROMPT]}],
        "parameters": {"max_tokens": N, "lora_name": "beta"},
    }
    r = httpx.post(server.url + "/v2/models/tiny/infer", json=infer).json()
    assert r["outputs"][0]["data"] == [expected["beta"]]


def test_an_unknown_adapter_is_a_validation_error_in_each_protocol(server):
    r = _lmi(server, {"adapters": "nope"})  # LMI's documented error response (it carries no message)
    assert r.status_code == 400 and r.json()["details"]["finish_reason"] == "error"
    r = httpx.post(server.url + "/generate", json={"inputs": PROMPT, "parameters": {"adapter_id": "nope"}})
    assert r.status_code == 422 and r.json()["error"] == "Adapter nope is not registered"
    r = httpx.post(server.url + "/v1/completions", json={"model": "nope", "prompt": PROMPT})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.post(
        server.url + "/v2/models/tiny/generate", json={"text_input": PROMPT, "parameters": {"lora_name": "nope"}}
    )
    assert r.status_code == 400 and "nope" in r.json()["error"]
    assert _lmi(server, {"adapters": "alpha"}).status_code == 200  # the server goes on


def test_register_use_update_describe_unregister(server, expected):
    gamma = server.adapters["gamma"]
    r = httpx.post(server.url + "/models/tiny/adapters", params={"name": "gamma", "src": str(gamma)})
    assert r.status_code == 200 and r.json() == {"status": "Adapter gamma registered"}
    assert _lmi(server, {"adapters": "gamma"}).json()["generated_text"] == expected["gamma"]
    described = httpx.get(server.url + "/models/tiny/adapters/gamma").json()
    assert described == {"name": "gamma", "src": str(gamma), "preload": True, "pin": False}
    r = httpx.post(server.url + "/models/tiny/adapters/gamma/update", params={"pin": "true"})
    assert r.json() == {"status": "Adapter gamma updated"}
    assert httpx.get(server.url + "/adapters/gamma").json()["pin"] is True
    again = httpx.post(server.url + "/models/tiny/adapters", params={"name": "gamma", "src": str(gamma)})
    assert again.status_code == 409
    r = httpx.delete(server.url + "/models/tiny/adapters/gamma")
    assert r.json() == {"status": "Adapter gamma unregistered"}
    assert httpx.get(server.url + "/models/tiny/adapters/gamma").status_code == 404
    assert httpx.delete(server.url + "/models/tiny/adapters/gamma").status_code == 404
    refused = _lmi(server, {"adapters": "gamma"})
    assert refused.status_code == 400 and refused.json()["details"]["finish_reason"] == "error"
    r = httpx.post(server.url + "/generate", json={"inputs": PROMPT, "parameters": {"adapter_id": "gamma"}})
    assert r.status_code == 422 and r.json()["error"] == "Adapter gamma is not registered"


def test_eviction_and_reload_keep_the_tokens(server, expected):
    """max_cpu_loras=2 and max_loras=2: three adapters in turn unload each other from host memory
    and take each other's device slots; each is read again from its directory when needed."""
    gamma = server.adapters["gamma"]
    httpx.post(server.url + "/models/tiny/adapters", params={"name": "gamma", "src": str(gamma)}).raise_for_status()
    before = httpx.get(server.url + "/models/tiny").json()[0]["stats"]["adapter_loads"]
    for name in ["alpha", "gamma", "beta", "alpha", "gamma", "beta"]:
        assert _lmi(server, {"adapters": name}).json()["generated_text"] == expected[name], name
    stats = httpx.get(server.url + "/models/tiny").json()[0]["stats"]
    assert stats["adapter_loads"] >= before + 3 and stats["adapters_loaded"] <= 2
    httpx.delete(server.url + "/models/tiny/adapters/gamma").raise_for_status()


def test_registration_refusals(server, tmp_path):
    r = httpx.post(server.url + "/models/tiny/adapters", params={"name": "wide", "src": str(server.adapters["wide"])})
    assert r.status_code == 403  # outside model_roots
    inside = server.model_dir / "adapters-extra" / "wide"
    shutil.copytree(server.adapters["wide"], inside)
    r = httpx.post(server.url + "/models/tiny/adapters", params={"name": "wide", "src": str(inside)})
    assert r.status_code == 424 and "rank 32" in r.text and "max_lora_rank (16)" in r.text
    assert "wide" not in [a["name"] for a in httpx.get(server.url + "/adapters").json()["adapters"]]
    r = httpx.post(server.url + "/models/tiny/adapters", params={"name": "x", "src": str(server.model_dir)})
    assert r.status_code == 424 and "adapter_config.json" in r.text
    assert httpx.post(server.url + "/models/nope/adapters", params={"name": "x", "src": "y"}).status_code == 404
    assert httpx.post(server.url + "/models/tiny/adapters", params={"src": str(inside)}).status_code == 400


def test_per_adapter_metrics(server):
    _lmi(server, {"adapters": "alpha"}).raise_for_status()
    text = httpx.get(server.url + "/metrics").text
    lines = [line for line in text.splitlines() if line.startswith("lmiserve_adapter_")]
    assert any(line.startswith('lmiserve_adapter_requests_total{adapter="alpha",model="tiny"}') for line in lines), (
        lines
    )
    assert any(
        line.startswith('lmiserve_adapter_generation_tokens_total{adapter="alpha",model="tiny"}') for line in lines
    )
    assert any(line.startswith('lmiserve_adapter_prompt_tokens_total{adapter="alpha",model="tiny"}') for line in lines)


def test_an_adapter_named_org_slash_name_is_found_by_mindies_adapter_id(server, expected):
    """MindIE's adapter_id: letters, digits, '.', '-', '_' and '/', up to 256 characters."""
    name = "org/gamma-1.0_x"
    gamma = server.adapters["gamma"]
    r = httpx.post(server.url + "/models/tiny/adapters", params={"name": name, "src": str(gamma)})
    assert r.status_code == 200 and r.json() == {"status": f"Adapter {name} registered"}
    try:
        body = {"inputs": PROMPT, "parameters": {"max_new_tokens": N, "adapter_id": name}}
        assert httpx.post(server.url + "/", json=body).json()[0]["generated_text"] == expected["gamma"]
        assert httpx.get(server.url + f"/models/tiny/adapters/{name}").json()["name"] == name
        r = httpx.post(server.url + f"/adapters/{name}/update", params={"pin": "false"})
        assert r.json() == {"status": f"Adapter {name} updated"}
    finally:
        assert httpx.delete(server.url + f"/models/tiny/adapters/{name}").status_code == 200
    for bad in ("None", "a" * 257, "/lead", "sp ace"):
        r = httpx.post(server.url + "/models/tiny/adapters", params={"name": bad, "src": str(gamma)})
        assert r.status_code == 400, bad
    body = {"inputs": PROMPT, "parameters": {"adapter_id": "a" * 257}}
    assert httpx.post(server.url + "/", json=body).status_code == 422
