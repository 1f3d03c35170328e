"""KeyValueAllGather on its own (threads as ranks, no library calls)."""

from __future__ import annotations

import threading

import pytest

from _workers import FileStore
from symmem import KeyValueAllGather


class DictStore:
    """An in-memory store whose get() blocks, like torch's stores."""

    def __init__(self):
        self.data = {}
        self.cond = threading.Condition()

    def set(self, key, value):
        with self.cond:
            self.data[key] = value
            self.cond.notify_all()

    def get(self, key):
        with self.cond:
            assert self.cond.wait_for(lambda: key in self.data, timeout=10), key
            return self.data[key]

    def delete_key(self, key):
        with self.cond:
            return self.data.pop(key, None) is not None


def gather_in_threads(store, world, rounds):
    out = [[] for _ in range(world)]

    def rank_main(rank):
        ag = KeyValueAllGather(store, rank, world, prefix="t")
        for n in range(rounds):
            out[rank].append(ag(bytes([rank, n]) * 3))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return out


@pytest.mark.parametrize("world", [1, 2, 5])
def test_gathers_in_rank_order(world):
    store = DictStore()
    out = gather_in_threads(store, world, 6)
    for rank in range(world):
        for n in range(6):
            assert out[rank][n] == [bytes([r, n]) * 3 for r in range(world)]
    # Only the last round's records remain (earlier ones were deleted).
    assert sorted(store.data) == sorted(f"t/5/{r}" for r in range(world))


def test_file_store(tmp_path):
    store = FileStore(str(tmp_path))
    out = gather_in_threads(store, 3, 4)
    assert out[2][3] == [bytes([r, 3]) * 3 for r in range(3)]


def test_bad_rank():
    with pytest.raises(ValueError):
        KeyValueAllGather(DictStore(), 2, 2)
