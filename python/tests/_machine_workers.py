"""Rank functions for test_machines.py: groups whose ranks are on several
machines, imitated on one host. Each rank's process starts with
SYMMEM_MACHINE_ID naming its machine and SYMMEM_SOCKET_DIR that machine's
socket directory (machine_env)."""

from __future__ import annotations

import ctypes
import os
import struct
from typing import Dict, List

TIMEOUT = 20.0


def machine_env(machines: List[int], sock_root: str):
    """run_ranks' env: rank r claims machine machines[r] and uses that
    machine's socket directory."""

    def env(rank: int) -> Dict[str, str]:
        d = os.path.join(sock_root, f"m{machines[rank]}")
        os.makedirs(d, mode=0o700, exist_ok=True)
        # SYMMEM_HIER_MIN_BYTES lowered: auto runs the larger all-reduces
        # hierarchically.
        return {"SYMMEM_MACHINE_ID": f"m{machines[rank]}", "SYMMEM_SOCKET_DIR": d, "SYMMEM_HIER_MIN_BYTES": "16K"}

    return env


def local_barrier(h, g, channel: int = 1) -> None:
    """A barrier of this machine's ranks through the signal pads (the
    group's barrier needs an engine between machines)."""
    peers = [p for p in range(g.world_size) if p != g.rank and g.is_local(p)]
    for p in peers:
        h.put_signal(p, channel)
    for p in peers:
        h.wait_signal(p, channel, timeout=TIMEOUT)


def _layout(g, h, machines: List[int], rank: int) -> Dict:
    return {
        "local": (g.local_rank, g.local_size),
        "is_local": [g.is_local(r) for r in range(g.world_size)],
        "mapped": [h.buffer_ptrs[r] != 0 for r in range(g.world_size)],
        "pads": [h.signal_pad_ptrs[r] != 0 for r in range(g.world_size)],
        "mapped_peers": h.mapped_peers,
        "machine": g.machine(rank),
    }


def _local_writes(g, h, buf, rank: int) -> bool:
    """Every rank writes its slot of each local peer's buffer; a local
    barrier; each checks what its local peers wrote."""
    world = g.world_size
    local_barrier(h, g)
    for p in range(world):
        if g.is_local(p):
            h.get_buffer(p).write(struct.pack("<Q", 1000 * rank + p), 8 * rank)
    local_barrier(h, g)
    got = struct.unpack(f"<{world}Q", buf.read(0, 8 * world))
    ok = all(got[w] == 1000 * w + rank for w in range(world) if g.is_local(w))
    local_barrier(h, g)
    return ok


def allgather_group(rank: int, world: int, machines: List[int], store_dir: str, name: str) -> Dict:
    """A group over a Python all-gather spanning machines: rendezvous and
    local mapping work; remote pointers are NULL; get_buffer of a remote rank
    raises naming it and its machine; what needs an engine between machines
    is UNAVAILABLE."""
    import symmem
    from _workers import FileStore
    from symmem.exchange import KeyValueAllGather

    store = FileStore(store_dir)
    ag = KeyValueAllGather(store, rank, world, prefix=name)
    info: Dict = {}
    with symmem.Group(name, rank, world, timeout=TIMEOUT, allgather=ag) as g:
        with symmem.empty(1 << 16) as buf:
            buf.fill(0)
            with symmem.rendezvous(buf, g) as h:
                info.update(_layout(g, h, machines, rank))
                info["writes_ok"] = _local_writes(g, h, buf, rank)
                remote = next(r for r in range(world) if not g.is_local(r))
                try:
                    h.get_buffer(remote)
                    info["remote_view"] = "no error"
                except symmem.SymmemError as e:
                    info["remote_view"] = (int(e.code), str(e))
                errors = {}
                for what, call in {
                    "all_reduce": lambda: h.all_reduce("float32", count=16),
                    "barrier": lambda: h.barrier(timeout=TIMEOUT),
                    "put_signal": lambda: h.put_signal(remote, 0),
                }.items():
                    try:
                        call()
                        errors[what] = None
                    except symmem.SymmemError as e:
                        errors[what] = (int(e.code), str(e))
                info["errors"] = errors
                local_barrier(h, g)
    return info


def socket_group(rank: int, world: int, name: str):
    """symmem_group_create across imitated machines sharing one socket
    directory: refused, naming the machines."""
    import symmem

    try:
        symmem.Group(name, rank, world, timeout=TIMEOUT).destroy()
        return None
    except symmem.SymmemError as e:
        return (int(e.code), str(e))


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def _comm(rank: int, world: int, job: str):
    nccl = ctypes.CDLL(os.environ["SYMMEM_LIBNCCL"])
    uid = UniqueId()
    uid.internal = f"fakenccl-{job}".encode()
    comm = ctypes.c_void_p()
    rc = nccl.ncclCommInitRank(ctypes.byref(comm), world, uid, rank)
    assert rc == 0, f"ncclCommInitRank: {rc}"
    return nccl, comm.value


def _ints(rank: int, count: int, call: int) -> List[int]:
    return [(rank * 7 + i * 3 + call) % 23 - 11 for i in range(count)]


def _variants(kind: str):
    """(op, algo) pairs a collective of kind runs with: all-reduce with every
    form across machines (auto, hierarchical, nccl), the others with the
    default (they run whole on NCCL)."""
    if kind == "all_gather":
        return [("sum", "auto")]
    algos = ("auto", "hierarchical", "nccl") if kind.startswith("all_reduce") else ("auto",)
    return [(op, algo) for op in ("sum", "max", "min") for algo in algos]


def nccl_group(rank: int, world: int, machines: List[int], job: str, engine: bool) -> Dict:
    """A group over the NCCL stand-in spanning machines. Always: creation,
    the local team, rendezvous (a window), local writes, NULL remote
    pointers. With engine (a stand-in that has typed collectives): every
    collective against integer references, barriers, remote signals (or
    UNAVAILABLE naming 2.29 on the 2.28 stand-in)."""
    import symmem

    nccl, comm = _comm(rank, world, job)
    info: Dict = {"nccl": symmem.nccl_version()}
    g = symmem.Group.from_nccl(comm, f"{job}-g", timeout=TIMEOUT)
    nbytes = 1 << 20
    buf = symmem.empty(nbytes)
    buf.fill(0)
    h = symmem.rendezvous(buf, g)
    info.update(_layout(g, h, machines, rank))
    info["window"] = h.nccl_window[0] != 0
    info["writes_ok"] = _local_writes(g, h, buf, rank)
    if engine:
        results = {}
        call = 0
        # The stand-in driver launches no kernels: there the hierarchical
        # all-reduce has no steps inside the machine and must say so (with
        # one rank per machine it has none to run).
        no_local = symmem.backend_name() == "cuda" and g.local_size > 1
        for count in (world, 7 * world, 1000 * world + 5, 8192 * world):
            for kind in ("all_reduce", "all_reduce_in_place", "all_gather", "reduce_scatter"):
                if kind == "reduce_scatter" and count % world:
                    continue
                for op, algo in _variants(kind):
                    call += 1
                    buf.write(struct.pack(f"<{count}i", *_ints(rank, count, call)))
                    out = buf.ptr + nbytes // 2
                    key = f"{kind}/{op}/{algo}/{count}"
                    if kind.startswith("all_reduce") and algo == "hierarchical" and no_local:
                        try:
                            h.all_reduce("int32", op, count=count, out=out, algo=algo)
                            results[key] = False
                        except symmem.SymmemError as e:
                            results[key] = e.code == symmem.Result.UNAVAILABLE and "hierarchical" in str(e)
                        continue
                    if kind == "all_reduce_in_place":
                        h.all_reduce("int32", op, count=count, algo=algo)
                        out = buf.ptr
                        n = count
                    elif kind == "all_reduce":
                        h.all_reduce("int32", op, count=count, out=out, algo=algo)
                        n = count
                    elif kind == "all_gather":
                        h.all_gather("int32", count=count, out=out)
                        n = count * world
                    else:
                        h.reduce_scatter("int32", op, count=count, out=out)
                        n = count // world
                    got = list(struct.unpack(f"<{n}i", buf.read(out - buf.ptr, 4 * n)))
                    ins = [_ints(r, count, call) for r in range(world)]
                    red = {"sum": sum, "max": max, "min": min}[op]
                    if kind.startswith("all_reduce"):
                        want = [red(ins[r][i] for r in range(world)) for i in range(count)]
                    elif kind == "all_gather":
                        want = [v for r in range(world) for v in ins[r]]
                    else:
                        per = count // world
                        want = [red(ins[r][rank * per + i] for r in range(world)) for i in range(per)]
                    results[key] = got == want
        info["collectives"] = results
        h.barrier(timeout=TIMEOUT)
        # Two signals to every rank of the other machines, then two waits for
        # each, on channel 0 (NCCL 2.29 has one signal slot per peer).
        remote = [r for r in range(world) if not g.is_local(r)]
        try:
            for r in remote:
                for _ in range(2):
                    h.put_signal(r, 0)
            for r in remote:
                for _ in range(2):
                    h.wait_signal(r, 0, timeout=TIMEOUT)
            info["remote_signal"] = None
        except symmem.SymmemError as e:
            info["remote_signal"] = (int(e.code), str(e))
        h.barrier(timeout=TIMEOUT)
    else:
        local_barrier(h, g)
    h.release()
    buf.free()
    g.destroy()
    nccl.ncclCommDestroy(ctypes.c_void_p(comm))
    return info
