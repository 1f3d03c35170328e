"""All-gathers built on a key-value store, for ``Group(allgather=...)``.

:class:`KeyValueAllGather` turns any store with ``set(key, bytes)`` and a
blocking ``get(key) -> bytes`` (torch.distributed's TCPStore, FileStore,
PrefixStore, or a test's own) into the all-gather callable that
:class:`symmem.Group` accepts.

Protocol: call number ``n`` (every rank makes the same calls in the same
order) writes ``<prefix>/<n>/<rank>`` and reads the keys of every rank for
``n``. Once a rank has read every record of call ``n``, every rank has
*written* call ``n``, which it does only after reading all of call ``n-1``;
so the rank may then delete its own key of call ``n-1``. The store thus
holds at most two records per rank and group.
"""

from __future__ import annotations

from typing import Any, List

__all__ = ["KeyValueAllGather"]


class KeyValueAllGather:
    """An all-gather over a key-value store.

    Args:
        store: an object with ``set(key: str, value: bytes)`` and
            ``get(key: str) -> bytes`` that blocks until the key exists (and
            times out by itself); ``multi_get(keys)`` and ``delete_key(key)``
            are used when present.
        rank, world_size: this rank and the number of ranks.
        prefix: keeps different groups on one store apart.
    """

    def __init__(self, store: Any, rank: int, world_size: int, prefix: str = "symmem"):
        if not 0 <= rank < world_size:
            raise ValueError(f"KeyValueAllGather: rank {rank} out of range [0, {world_size})")
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.prefix = prefix
        self._seq = 0

    def _key(self, seq: int, rank: int) -> str:
        return f"{self.prefix}/{seq}/{rank}"

    def __call__(self, data: bytes) -> List[bytes]:
        seq = self._seq
        self._seq += 1
        self.store.set(self._key(seq, self.rank), bytes(data))
        keys = [self._key(seq, r) for r in range(self.world_size)]
        multi_get = getattr(self.store, "multi_get", None)
        if multi_get is not None:
            parts = [bytes(v) for v in multi_get(keys)]
        else:
            parts = [bytes(self.store.get(k)) for k in keys]
        if seq > 0:
            delete = getattr(self.store, "delete_key", None)
            if delete is not None:
                try:
                    delete(self._key(seq - 1, self.rank))
                except Exception:  # some stores cannot delete; the keys are small
                    pass
        return parts
