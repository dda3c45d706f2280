"""The adapters' book: host copies (max_cpu_loras, least recently used out, pinned kept), device
slots (max_loras, held while a request runs), and what unregistering does to requests in flight."""

import pytest

from lmiserve.rolling_batch.lora.adapters import AdapterBook, AdapterError


def book(max_loras=2, max_cpu_loras=2):
    reads = []

    def load(src):
        if src == "broken":
            raise ValueError("not an adapter")
        reads.append(src)
        return f"weights of {src}"

    b = AdapterBook(max_loras, max_cpu_loras, load)
    b.reads = reads
    return b


def test_host_copies_stay_within_max_cpu_loras_least_recently_used_first():
    b = book()
    for name in "abc":
        b.register(name, name)
    assert [n for n, a in b.adapters.items() if a.weights] == ["b", "c"]
    b.done(b.use("a"))  # read again; "b" is now the least recently used
    assert [n for n, a in b.adapters.items() if a.weights] == ["a", "c"] and b.reads == ["a", "b", "c", "a"]


def test_pinned_and_in_use_adapters_are_not_unloaded():
    b = book()
    b.register("a", "a", pin=True)
    b.register("b", "b")
    held = b.use("b")
    b.register("c", "c")  # nothing idle to unload: three copies for a while
    assert all(a.weights for a in b.adapters.values())
    b.done(held)  # back within the limit once "b" is idle; pinned "a" stays
    assert [n for n, a in b.adapters.items() if a.weights] == ["a", "c"]


def test_slots_are_held_by_running_requests_and_reused_least_recently_used():
    b = book(max_loras=2, max_cpu_loras=3)
    adapters = {name: b.register(name, name) for name in "abc"}
    assert b.acquire(adapters["a"]) and b.acquire(adapters["b"])
    assert not b.acquire(adapters["c"])  # both slots held
    b.release(adapters["a"])
    assert b.acquire(adapters["c"]) and adapters["c"].slot == 0 and adapters["a"].slot is None
    assert [slot for slot, _ in b.take_pending()] == [0, 1, 0] and b.take_pending() == []


def test_a_pinned_adapter_keeps_its_slot():
    b = book(max_loras=2, max_cpu_loras=3)
    a = b.register("a", "a", pin=True)
    x, y = b.register("x", "x"), b.register("y", "y")
    for adapter in (a, x):
        assert b.acquire(adapter)
        b.release(adapter)
    taken = x.slot
    assert b.acquire(y) and y.slot == taken != a.slot and x.slot is None


def test_unregistering_lets_requests_in_flight_finish():
    b = book()
    a = b.register("a", "a")
    held = b.use("a")
    b.acquire(held)
    b.unregister("a")
    with pytest.raises(AdapterError) as err:
        b.use("a")
    assert err.value.kind == "not_found"
    assert a.weights is not None and a.slot is not None  # still in use
    b.release(held)
    b.done(held)
    assert a.weights is None and a.slot is None and b.owners == [None, None]
    b.register("a", "a")  # the name is free again, with a new cache key
    assert b.adapters["a"].key != a.key


@pytest.mark.parametrize(
    "call,kind",
    [
        (lambda b: b.register("a", "a"), "conflict"),
        (lambda b: b.register("z", "broken"), "unloadable"),
        (lambda b: b.register("z", "z", preload=False, pin=True), "invalid"),
        (lambda b: b.update("missing"), "not_found"),
        (lambda b: [b.register(n, n, pin=True) for n in "pqr"], "no_capacity"),  # 2 slots: 2 pins
    ],
)
def test_refusals(call, kind):
    b = book()
    b.register("a", "a")
    with pytest.raises(AdapterError) as err:
        call(b)
    assert err.value.kind == kind


def test_not_preloaded_adapters_load_on_first_use_and_unload_when_idle():
    b = book()
    a = b.register("a", "a", preload=False)
    assert a.weights is None and b.reads == []
    held = b.use("a")
    assert a.weights == "weights of a"
    b.done(held)
    assert a.weights is None
    b.update("a", preload=True)
    assert a.weights == "weights of a" and a.preload
