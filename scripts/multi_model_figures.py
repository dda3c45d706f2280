"""Multi-model mode figures: cold-load time per model, warm latency with 1 and with 3 models resident.

Builds three tiny random models (Llama, Qwen2, Qwen3) and a SmolLM2-135M-Instruct directory under a
temporary model root, starts ``lmiserve serve`` in multi-model mode on 127.0.0.1, then:

- loads each model with SageMaker's load call (``POST /models``), unloads it and loads it again: the
  first load includes what a fresh server does once per architecture, the second is a model's cold load;
- sends ``--requests`` greedy requests (``--tokens`` new tokens each) to SmolLM2 with it alone resident,
  then with the three tiny models resident as well, and round-robin over three resident models.

Prints one JSON report (seconds). A benchmark to run by hand, not a test:

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/multi_model_figures.py --requests 20 --tokens 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmiserve.model_store import DEFAULT_MODEL_ID  # noqa: E402
from tests.server_process import ServerProcess  # noqa: E402
from tests.tiny_models import build_model  # noqa: E402

ENGINE = "option.rolling_batch=lmi\noption.max_model_len=512\n"
PROMPT = "What is Deep Learning?"


def model_root(base: Path) -> Path:
    root = base / "models"
    for name in ("llama", "qwen2", "qwen3"):
        build_model(root / name, arch=name)
        (root / name / "serving.properties").write_text(ENGINE + "option.dtype=fp32\n")
    (root / "smollm2").mkdir(parents=True)
    (root / "smollm2" / "serving.properties").write_text(f"option.model_id={DEFAULT_MODEL_ID}\n" + ENGINE)
    return root


def timed(call) -> float:  # type: ignore[no-untyped-def]
    began = time.perf_counter()
    response = call()
    elapsed = time.perf_counter() - began
    assert response.status_code == 200, response.text
    return elapsed


def latencies(client: httpx.Client, models: list[str], requests: int, tokens: int) -> dict[str, float]:
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": tokens, "do_sample": False}}
    times = [
        timed(lambda i=i: client.post(f"/models/{models[i % len(models)]}/invoke", json=body)) for i in range(requests)
    ]
    times.sort()
    return {"median": round(statistics.median(times), 4), "p90": round(times[int(0.9 * (len(times) - 1))], 4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        root = model_root(base)
        (base / "home").mkdir()
        env = {"SAGEMAKER_MULTI_MODEL": "true", "SERVING_MULTI_MODEL_ROOT": str(root), "HF_HUB_OFFLINE": "1"}
        with ServerProcess(base / "home", env=env, args=["--grpc-port", "0"]) as server:
            server.wait_ready()
            client = httpx.Client(base_url=server.url, timeout=600)
            loads: dict[str, dict[str, float]] = {}
            for name in ("llama", "qwen2", "qwen3", "smollm2"):
                load = lambda n=name: client.post("/models", json={"model_name": n, "url": str(root / n)})  # noqa: E731
                first = timed(load)
                assert client.delete(f"/models/{name}").status_code == 200
                loads[name] = {"first_load": round(first, 2), "cold_load": round(timed(load), 2)}
                if name != "smollm2":
                    assert client.delete(f"/models/{name}").status_code == 200
            warm = {"smollm2, 1 resident": latencies(client, ["smollm2"], args.requests, args.tokens)}
            for name in ("llama", "qwen2"):
                timed(lambda n=name: client.post("/models", json={"model_name": n, "url": str(root / n)}))
            resident = sorted(m["modelName"] for m in client.get("/models").json()["models"])
            warm["smollm2, 3 resident"] = latencies(client, ["smollm2"], args.requests, args.tokens)
            warm["round-robin llama/qwen2/smollm2, 3 resident"] = latencies(
                client, ["llama", "qwen2", "smollm2"], args.requests, args.tokens
            )
            client.close()
    report = {
        "requests": args.requests,
        "max_new_tokens": args.tokens,
        "resident": resident,
        "load_seconds": loads,
        "warm_latency_seconds": warm,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
