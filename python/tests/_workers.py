"""Rank functions for the multi-process tests (run by _mp.run_ranks).

Each takes (rank, world, ...) and returns something picklable for the test
to check, so that assertions about every rank happen in the parent.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Dict, List

import symmem
from symmem import KeyValueAllGather

TIMEOUT = 30.0


def outcomes(calls, also=()) -> Dict:
    """what -> None where call() returned, else (exception type, code,
    message) for a SymmemError, or for an exception of also (code 0)."""
    got = {}
    for what, call in calls:
        try:
            call()
            got[what] = None
        except symmem.SymmemError as exc:
            got[what] = (type(exc).__name__, int(exc.code), str(exc))
        except also as exc:
            got[what] = (type(exc).__name__, 0, str(exc))
    return got


def device_of(rank: int) -> int:
    """The device a rank uses: its own GPU where there are enough, else
    shared (SYMMEM_ALLOW_OVERLAPPING_DEVICES=1); the host backend has one."""
    return rank % symmem.device_count()


class FileStore:
    """A tiny key-value store in a shared folder (for the callback tests).

    set() writes atomically (temporary file + rename); get() waits for the
    key; delete_key() removes it.
    """

    def __init__(self, root: str, timeout: float = TIMEOUT):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.timeout = timeout
        self.sets = 0
        self.deletes = 0

    def _path(self, key: str) -> Path:
        return self.root / key.replace("/", "%")

    def set(self, key: str, value: bytes) -> None:
        path = self._path(key)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_bytes(value)
        os.replace(tmp, path)
        self.sets += 1

    def get(self, key: str) -> bytes:
        path = self._path(key)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return path.read_bytes()
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"FileStore: {key} not set in {self.timeout} s")
                time.sleep(0.002)

    def delete_key(self, key: str) -> bool:
        try:
            self._path(key).unlink()
            self.deletes += 1
            return True
        except FileNotFoundError:
            return False

    def keys(self) -> List[str]:
        return sorted(p.name for p in self.root.iterdir() if ".tmp" not in p.name)


def _pattern(writer: int, reader: int, n: int) -> bytes:
    """n bytes that say who wrote them for whom."""
    seed = (writer * 131 + reader * 7 + 1) & 0xFF
    return bytes((seed + i) & 0xFF for i in range(n))


def write_every_peer(rank: int, world: int, name: str, nbytes: int, store_dir: str = "", offset: int = 0) -> Dict:
    """Every rank writes its own slot of every peer's buffer, then checks
    that its buffer holds every rank's pattern. Works on both backends
    (Buffer.read/write go through symmem_copy on the legacy default stream,
    where the cuda backend also queues the barrier's signals).

    store_dir: use a Python all-gather over a FileStore there instead of
    the built-in exchange. offset: rendezvous on buf.ptr + offset.
    """
    allgather = None
    store = None
    dev = device_of(rank)
    if store_dir:
        store = FileStore(store_dir)
        allgather = KeyValueAllGather(store, rank, world, prefix=name)
    with symmem.Group(name, rank, world, device=dev, timeout=TIMEOUT, allgather=allgather) as g:
        assert (g.rank, g.world_size, g.device) == (rank, world, dev)
        with symmem.empty(nbytes + offset, dev) as buf:
            buf.fill(0)
            with symmem.rendezvous(buf.ptr + offset, g) as h:
                info = {
                    "rank": h.rank,
                    "world_size": h.world_size,
                    "offset": h.offset,
                    "buffer_size": h.buffer_size,
                    "own_ptr_ok": h.buffer_ptrs[rank] + h.offset == buf.ptr + offset,
                    "distinct_ptrs": len(set(h.buffer_ptrs)) == world,
                    "signal_pad_size": h.signal_pad_size,
                    "distinct_pads": len(set(h.signal_pad_ptrs)) == world,
                }
                h.barrier(timeout=TIMEOUT)  # everyone has zeroed before anyone writes
                chunk = nbytes // world
                for peer in range(world):
                    view = h.get_buffer(peer)
                    assert view.nbytes == h.buffer_size - h.offset
                    view.write(_pattern(rank, peer, chunk), rank * chunk)
                h.barrier(timeout=TIMEOUT)
                own = buf.read(offset, nbytes)
                info["slots_ok"] = [own[w * chunk : (w + 1) * chunk] == _pattern(w, rank, chunk) for w in range(world)]
                # Reading a peer's memory directly sees what was written there.
                peer = (rank + 1) % world
                info["peer_read_ok"] = h.get_buffer(peer).read(rank * chunk, chunk) == _pattern(rank, peer, chunk)
                if buf.kind == "host":
                    mv = h.get_buffer(peer).memoryview()
                    info["peer_read_ok"] &= bytes(mv[rank * chunk : (rank + 1) * chunk]) == _pattern(rank, peer, chunk)
                h.barrier(timeout=TIMEOUT)  # nobody frees while others read
    if store is not None:
        info["store_sets"] = store.sets
        info["store_deletes"] = store.deletes
    return info


def _u64(x: int) -> bytes:
    return x.to_bytes(8, "little")


def signal_ring(rank: int, world: int, name: str, rounds: int) -> Dict:
    """A token goes round the ring `rounds` times with put/wait signals;
    each hop writes the token into the next rank's buffer first."""
    dev = device_of(rank)
    with symmem.Group(name, rank, world, device=dev, timeout=TIMEOUT) as g, symmem.empty(64, dev) as buf:
        with symmem.rendezvous(buf, g) as h:
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            seen = []
            for r in range(rounds):
                if rank == 0:
                    h.get_buffer(nxt).write(_u64(r * world + 1))
                    h.put_signal(nxt, channel=1)
                    h.wait_signal(prv, channel=1, timeout=TIMEOUT)
                    seen.append(int.from_bytes(buf.read(0, 8), "little"))
                else:
                    h.wait_signal(prv, channel=1, timeout=TIMEOUT)
                    token = int.from_bytes(buf.read(0, 8), "little")
                    seen.append(token)
                    h.get_buffer(nxt).write(_u64(token + 1))
                    h.put_signal(nxt, channel=1)
            # Errors that must not disturb the group.
            errors = {}
            if buf.kind == "host":  # on cuda the wait would be queued, not timed
                try:
                    h.wait_signal(prv, channel=2, timeout=0.2)
                except symmem.SymmemError as e:
                    errors["wait_timeout"] = (type(e).__name__, int(e.code), isinstance(e, TimeoutError))
            nchan = h.signal_pad_size // (4 * world)
            for what, call in (
                ("bad_channel", lambda: h.put_signal(nxt, channel=nchan)),
                ("bad_rank", lambda: h.put_signal(world)),
                ("negative_rank", lambda: h.wait_signal(-1, timeout=0.1)),
            ):
                try:
                    call()
                except symmem.SymmemError as e:
                    errors[what] = (type(e).__name__, int(e.code), e.message)
            h.barrier(timeout=TIMEOUT)
            buf.read(0, 8)  # on cuda: waits for the queued barrier
    return {"seen": seen, "errors": errors, "kind": buf.kind}


def mismatched_sizes(rank: int, world: int, name: str) -> Dict:
    """Rank 0 allocates a different size: rendezvous must fail everywhere."""
    size = 4096 if rank == 0 else 8192
    dev = device_of(rank)
    with symmem.Group(name, rank, world, device=dev, timeout=TIMEOUT) as g, symmem.empty(size, dev) as buf:
        try:
            with symmem.rendezvous(buf, g):
                return {"raised": None}
        except symmem.SymmemError as e:
            return {"raised": type(e).__name__, "code": int(e.code), "message": e.message}


def failing_allgather(rank: int, world: int, name: str) -> Dict:
    """The Python all-gather raises: group creation fails with it as cause."""

    def boom(data: bytes):
        raise ValueError(f"no all-gather today (rank {rank})")

    try:
        symmem.Group(name, rank, world, device=device_of(rank), timeout=5.0, allgather=boom)
    except symmem.SymmemError as e:
        cause = e.__cause__
        return {"raised": type(e).__name__, "cause": type(cause).__name__ if cause else None, "cause_msg": str(cause)}
    return {"raised": None}


def placement(rank: int, world: int, seed: int, steps: int) -> List[int]:
    """The heap offsets a seeded alloc/free sequence gets (invariant 2)."""
    rng = random.Random(seed)
    live: List[int] = []
    offsets = []
    for _ in range(steps):
        if live and rng.random() < 0.4:
            symmem.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([0, 1, 511, 512, 4096, 100_000, 1 << 20, 3 << 20])
            ptr = symmem.alloc(size)
            live.append(ptr)
            offsets.append(symmem.pointer_info(ptr).heap_offset)
    for ptr in live:
        symmem.free(ptr)
    return offsets


def rendezvous_twice(rank: int, world: int, name: str) -> Dict:
    """Two buffers, two handles on one group; handles survive the group."""
    dev = device_of(rank)
    g = symmem.Group(name, rank, world, device=dev, timeout=TIMEOUT)
    a, b = symmem.empty(1 << 16, dev), symmem.empty(3 << 20, dev)
    a.fill(0)
    b.fill(0)
    ha = symmem.rendezvous(a, g)
    hb = g.rendezvous(b)
    g.destroy()
    ha.barrier(timeout=TIMEOUT)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    hb.get_buffer(nxt).write(bytes([100 + rank]), rank)
    ha.get_buffer(nxt).write(bytes([200 + rank]), rank)
    ha.barrier(timeout=TIMEOUT)
    got = (b.read(prv, 1)[0], a.read(prv, 1)[0])
    hb.barrier(timeout=TIMEOUT)
    b.read(0, 1)  # on cuda: waits for the queued barrier
    ha.release()
    hb.release()
    a.free()
    b.free()
    return {"got": got, "want": (100 + prv, 200 + prv)}


def _coll_inputs(rank: int, count: int, fmt: str) -> list:
    """Rank's input of a collective test: int32 or exactly representable
    float32 values (sums of small multiples of 1/4 are exact in any order)."""
    if fmt == "i":
        return [(rank + 1) * 100003 * (i + 1) - 7 * i for i in range(count)]
    return [((rank * 37 + i * 11) % 97 - 48) / 4 for i in range(count)]


def collectives(rank: int, world: int, name: str, count: int) -> Dict:
    """Every collective through symmem.Handle's methods: int32 sum / max and
    float32 sum / min all-reduce (in place, out of place, one- and two-shot),
    all-gather into a local buffer, reduce-scatter; numpy dtypes where numpy
    is importable; bad calls. Returns what was read back."""
    import struct

    dev = device_of(rank)
    out: Dict = {}
    with symmem.Group(name, rank, world, device=dev, timeout=TIMEOUT) as g:
        nbytes = (count * 4 * world * 2 + 255) // 256 * 256
        with symmem.empty(nbytes, dev) as buf, symmem.empty(nbytes, dev) as local:
            with symmem.rendezvous(buf, g) as h:

                def put(fmt):
                    buf.write(struct.pack(f"<{count}{fmt}", *_coll_inputs(rank, count, fmt)))

                def get(b, n, fmt, offset=0):
                    return list(struct.unpack(f"<{n}{fmt}", b.read(offset, 4 * n)))

                put("i")
                h.all_reduce("int32", count=count)
                out["sum_inplace"] = get(buf, count, "i")
                put("i")
                h.all_reduce("int32", "max", count=count, out=local)
                out["max_local"] = get(local, count, "i")
                put("f")
                h.all_reduce("float32", count=count, out=buf.ptr + nbytes // 2, algo="two_shot")
                out["fsum_two_shot"] = get(buf, count, "f", nbytes // 2)
                put("f")
                h.all_reduce("float32", "min", count=count, algo="one_shot")
                out["fmin_one_shot"] = get(buf, count, "f")
                put("f")
                h.all_reduce("float32", count=count, out=local, algo="low_latency")
                out["fsum_low_latency"] = get(local, count, "f")
                put("i")
                h.all_gather("int32", count=count, out=local)
                out["gather"] = get(local, world * count, "i")
                put("i")
                h.all_gather("int32", count=count, out=local, algo="one_shot")
                out["gather_one_shot"] = get(local, world * count, "i")
                put("i")
                h.reduce_scatter("int32", count=count - count % world, out=local)
                out["scatter"] = get(local, count // world, "i")
                try:
                    import numpy
                except ImportError:
                    numpy = None
                if numpy is not None:
                    put("f")
                    h.all_reduce(numpy.float32, count=count, out=local)
                    out["numpy"] = get(local, count, "f")
                # Whole-buffer default count: every element of every rank.
                n = (h.buffer_size - h.offset) // 4
                h.get_buffer(rank).write(struct.pack(f"<{n}i", *([rank + 1] * n)))
                h.all_reduce("int32")
                whole = list(struct.unpack(f"<{n}i", h.get_buffer(rank).read(0, 4 * n)))
                out["whole_ok"] = whole == [world * (world + 1) // 2] * n
                out["errors"] = outcomes((
                    ("dtype", lambda: h.all_reduce("complex64", count=4)),
                    ("op", lambda: h.all_reduce("int32", "prod", count=4)),
                    ("count", lambda: h.all_reduce("int32", count=(h.buffer_size - h.offset) // 4 + 1)),
                    ("misaligned", lambda: h.all_reduce("int32", count=4, out=local.ptr + 4)),
                    ("overlap", lambda: h.all_reduce("int32", count=64, out=buf.ptr + 16)),
                    ("no_out", lambda: h.all_gather("int32", count=4)),
                ))
                out["device_error"] = h.device_error()
    return out


def collectives_mismatch(rank: int, world: int, name: str) -> Dict:
    """The last rank calls with another count, dtype, op, kind or algorithm
    than the others; every rank reports what it got, and whether its output
    stayed untouched. A matching call then works."""
    dev = device_of(rank)
    out: Dict = {}
    calls = {
        "count": lambda h, local, last: h.all_reduce("float32", count=128 if last else 256, out=local, algo="one_shot"),
        "dtype": lambda h, local, last: h.all_reduce("int32" if last else "float32", count=256, out=local, algo="one_shot"),
        "op": lambda h, local, last: h.all_reduce("float32", "max" if last else "sum", count=256, out=local, algo="one_shot"),
        "kind": lambda h, local, last: (h.all_gather if last else h.all_reduce)("float32", count=256, out=local),
        "algo": lambda h, local, last: h.all_reduce("float32", count=256, algo="two_shot" if last else "one_shot"),
    }
    with symmem.Group(name, rank, world, device=dev, timeout=TIMEOUT) as g:
        with symmem.empty(1 << 16, dev) as buf, symmem.empty(1 << 16, dev) as local:
            with symmem.rendezvous(buf, g) as h:
                for what, call in calls.items():
                    local.write(b"\xee" * 4096)
                    try:
                        call(h, local.ptr, rank == world - 1)
                        out[what] = None
                    except symmem.SymmemError as e:
                        out[what] = (type(e).__name__, int(e.code), e.message, local.read(0, 4096) == b"\xee" * 4096)
                h.all_reduce("float32", count=64, out=local.ptr)
                out["after"] = "ok"
                try:
                    out["device_error"] = h.device_error()
                except symmem.SymmemError as e:
                    out["device_error"] = (type(e).__name__, e.message)
    return out


def collectives_late_peer(rank: int, world: int, name: str, timeout: float, late: float, algo: str) -> Dict:
    """A late peer: the group's timeout is timeout seconds; both
    ranks run all-reduce #1, rank 0 runs #2 while rank 1 is busy for late
    seconds (> timeout), rank 1 then runs #2, and both run #3-#6, each call
    with fresh inputs (call*10 + rank + 1 in every element). Returns per
    call (error class name or "ok", message, what the buffer held after
    it, seconds it took)."""
    import struct
    import time

    count = 256
    calls: Dict = {}
    with symmem.Group(name, rank, world, device=device_of(rank), timeout=timeout) as g:
        with symmem.empty(count * 4, device_of(rank)) as buf, symmem.rendezvous(buf, g) as h:
            for call in range(1, 7):
                if call == 2 and rank == 1:
                    time.sleep(late)
                buf.write(struct.pack(f"<{count}f", *[call * 10 + rank + 1] * count))
                start = time.monotonic()
                try:
                    h.all_reduce("float32", count=count, algo=algo)
                    outcome, msg = "ok", ""
                except symmem.SymmemError as exc:
                    outcome, msg = type(exc).__name__, str(exc)
                took = time.monotonic() - start
                calls[call] = (outcome, msg, sorted(set(struct.unpack(f"<{count}f", buf.read(0, count * 4)))), took)
    return calls
