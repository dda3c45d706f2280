"""The multi-model pool: LRU unloading within the budget, leases, one load per model, lookup."""

import asyncio

import pytest

from lmiserve.config import load_settings
from lmiserve.errors import Conflict, InsufficientMemory, ModelLoadFailed, NotFound
from lmiserve.serving import model_pool
from lmiserve.serving.handler_model import ModelLoadError
from lmiserve.serving.model_pool import MIB, ModelPool, required_memory
from lmiserve.serving.registry import ModelRegistry


class FakeModel:
    kind = "fake"

    def __init__(self, settings, log):
        self.name, self.settings, self.log = settings.model_name, settings, log
        self.status = "Loading"

    async def start(self):
        self.log.append(("start", self.name))
        await asyncio.sleep(0.01)
        if self.name == "bad":
            raise ModelLoadError("no weights")
        self.status = "Healthy"

    async def stop(self):
        self.log.append(("stop", self.name))

    def describe(self):
        return {}


@pytest.fixture
def pool(tmp_path, monkeypatch):
    root = tmp_path / "models"
    for name, mb in {"a": 100, "b": 100, "c": 100, "big": 300, "bad": 10}.items():
        (root / name).mkdir(parents=True)
        (root / name / "serving.properties").write_text(f"required_memory_mb={mb}\n")
    (root / "sm" / "model").mkdir(parents=True)  # SageMaker's layout
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "SAGEMAKER_MULTI_MODEL": "true",
        "SERVING_MULTI_MODEL_ROOT": str(root),
        "SERVING_MULTI_MODEL_MEMORY_MB": "250",
    }
    log: list = []
    monkeypatch.setattr(model_pool, "build_model", lambda settings: FakeModel(settings, log))
    p = ModelPool(ModelRegistry(), load_settings(home, env=env))
    p.log = log
    return p


async def use(pool, name):
    (await pool.acquire(name, load=True)).release()


def test_least_recently_used_idle_model_goes(pool):
    async def go():
        await use(pool, "a")
        await use(pool, "b")
        await use(pool, "a")  # b is now the least recently used
        await use(pool, "c")
        assert pool.resident() == ["a", "c"] and sorted(pool.registry.models) == ["a", "c"]
        assert ("stop", "b") in pool.log and pool.used() == 200 * MIB

    asyncio.run(go())


def test_a_lease_keeps_its_model_and_a_model_too_big_gets_507(pool):
    async def go():
        with pytest.raises(InsufficientMemory):
            await use(pool, "big")  # 300 MiB never fits in 250
        lease = await pool.acquire("a", load=True)
        await use(pool, "b")
        await use(pool, "c")  # b goes, a is held
        assert pool.resident() == ["a", "c"] and ("stop", "b") in pool.log
        c_lease = await pool.acquire("c", load=True)
        with pytest.raises(InsufficientMemory, match="held by models in use"):
            await use(pool, "b")
        assert ("stop", "a") not in pool.log and ("stop", "c") not in pool.log
        lease.release()
        c_lease.release()
        await use(pool, "b")  # a is idle now and goes
        assert pool.resident() == ["c", "b"]

    asyncio.run(go())


def test_concurrent_first_requests_share_one_load(pool):
    async def go():
        leases = await asyncio.gather(*(pool.acquire("a.tar.gz", load=True) for _ in range(5)))
        assert pool.log.count(("start", "a")) == 1
        assert {lease.model.name for lease in leases} == {"a"}
        for lease in leases:
            lease.release()

    asyncio.run(go())


def test_unload_waits_for_the_requests_in_flight(pool):
    async def go():
        lease = await pool.acquire("a", load=True)
        unload = asyncio.create_task(pool.unload("a"))
        for _ in range(5):
            await asyncio.sleep(0)
        assert pool.resident() == [] and "a" not in pool.registry.models  # no new request reaches it
        assert not unload.done() and ("stop", "a") not in pool.log
        lease.release()
        await unload
        assert ("stop", "a") in pool.log
        with pytest.raises(NotFound):
            await pool.unload("a")

    asyncio.run(go())


def test_explicit_loads_missing_models_and_failures(pool):
    async def go():
        await pool.load("x", str(pool.root / "a"))
        with pytest.raises(Conflict):
            await pool.load("x", str(pool.root / "a"))
        with pytest.raises(NotFound):
            await pool.acquire("a", load=False)
        with pytest.raises(NotFound, match="models there: a, b, bad, big, c, sm"):
            await pool.acquire("nope", load=True)
        with pytest.raises(ModelLoadFailed, match="no weights"):
            await pool.acquire("bad", load=True)
        assert pool.resident() == ["x"]

    asyncio.run(go())


def test_find(pool):
    assert pool.find("sm") == pool.root / "sm" / "model"
    assert pool.find("a.tar.gz") == pool.root / "a"
    for bad in ("../a", "a/b", "..", ""):
        with pytest.raises(NotFound):
            pool.find(bad)


def test_required_memory_is_declared_or_estimated_from_the_weights(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * (10 * MIB))
    (tmp_path / "tokenizer.json").write_bytes(b"\0" * (5 * MIB))  # not weights
    assert required_memory(load_settings(tmp_path, env={})) == 12 * MIB
    (tmp_path / "serving.properties").write_text("required_memory_mb=700\n")
    assert required_memory(load_settings(tmp_path, env={})) == 700 * MIB
