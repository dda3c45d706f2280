"""The in-memory store of the Responses API: its size bound and its time-to-live."""

from lmiserve.serving.response_store import ResponseStore


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def response(n):
    return {"id": f"resp_{n}", "output": [n]}


def test_get_delete_and_the_conversation_kept():
    store = ResponseStore(10, 60, Clock())
    store.put(response(1), [{"role": "user", "content": "hi"}])
    stored = store.get("resp_1")
    assert stored.response == response(1) and stored.conversation == [{"role": "user", "content": "hi"}]
    assert store.get("resp_2") is None
    assert store.delete("resp_1") and not store.delete("resp_1") and store.get("resp_1") is None


def test_storing_past_the_size_forgets_the_oldest():
    store = ResponseStore(3, 0, Clock())
    for n in range(5):
        store.put(response(n), [])
    assert len(store) == 3
    assert [store.get(f"resp_{n}") is not None for n in range(5)] == [False, False, True, True, True]


def test_responses_expire_after_the_ttl():
    clock = Clock()
    store = ResponseStore(10, 60, clock)
    store.put(response(1), [])
    clock.now += 30
    store.put(response(2), [])
    clock.now += 29.9
    assert store.get("resp_1") is not None
    clock.now += 0.1
    assert store.get("resp_1") is None and store.get("resp_2") is not None
    clock.now += 30
    assert store.get("resp_2") is None and len(store) == 0


def test_no_ttl_keeps_them_and_size_zero_keeps_none():
    clock = Clock()
    forever = ResponseStore(2, 0, clock)
    forever.put(response(1), [])
    clock.now += 10**9
    assert forever.get("resp_1") is not None
    none = ResponseStore(0, 60, clock)
    none.put(response(1), [])
    assert none.get("resp_1") is None and len(none) == 0


def test_every_api_process_passes_responses_to_the_main_one():
    from lmiserve.server.forward import is_data_plane

    for method, path in (("POST", "/v1/responses"), ("GET", "/v1/responses/resp_1"), ("DELETE", "/v1/responses/r")):
        assert not is_data_plane({"method": method, "path": path, "server": ("127.0.0.1", 8080)})
