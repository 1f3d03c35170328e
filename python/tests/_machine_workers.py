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


def _a2a_functions():
    """The all-to-all entry points of include/symmem.h."""
    import symmem._lib as _lib

    lib = _lib.lib()
    names = ("symmem_all_to_all", "symmem_all_to_all_v", "symmem_all_to_all_v_2d", "symmem_all_to_all_v_2d_offset")
    return {name: getattr(lib, name) for name in names}


def _a2a_v(fns, h, layout: int, row_bytes: int, experts: int, splits_ptr: int, out_ptr: int, out_rows: int, so_ptr: int, align: int, stream=None):
    """One split-driven all-to-all through the C entry point of layout."""
    import _a2a_machines_ref as ref

    if layout == ref.V:
        return fns["symmem_all_to_all_v"](h._ptr, row_bytes, splits_ptr, out_ptr, out_rows, so_ptr, stream)
    if layout == ref.V2D:
        return fns["symmem_all_to_all_v_2d"](h._ptr, row_bytes, experts, splits_ptr, out_ptr, out_rows, so_ptr, align, stream)
    return fns["symmem_all_to_all_v_2d_offset"](h._ptr, row_bytes, experts, splits_ptr, out_ptr, out_rows, so_ptr, stream)


def nccl_all_to_all(rank: int, world: int, machines: List[int], job: str) -> Dict:
    """Every all-to-all form on a group over the NCCL stand-in spanning
    machines, against _a2a_machines_ref: equal splits, the v, dispatch and combine
    forms with zero splits and everything for rank 0, and the last rank's
    overrun (it alone fails, naming itself; the others receive theirs).
    Returns {case: None when right, else what was wrong}."""
    import random

    import _a2a_machines_ref as ref
    import symmem
    from symmem._lib import _last_message

    nccl, comm = _comm(rank, world, job)
    g = symmem.Group.from_nccl(comm, f"{job}-g", timeout=TIMEOUT)
    nbytes = 1 << 20
    buf = symmem.empty(nbytes)
    buf.fill(0)
    h = symmem.rendezvous(buf, g)
    out, tab, so = symmem.empty(nbytes), symmem.empty(1 << 16), symmem.empty(1 << 16)
    fns = _a2a_functions()
    results: Dict[str, object] = {}
    call = 0
    for count in (1, 5, 1000):
        call += 1
        vals = lambda r, p: [r * 100000 + p * 1000 + (i + call) % 997 for i in range(count)]  # noqa: E731
        buf.write(struct.pack(f"<{count * world}i", *[v for p in range(world) for v in vals(rank, p)]))
        out.fill(0xEE, 0, 4 * count * world)
        rc = fns["symmem_all_to_all"](h._ptr, symmem._enums.DTYPES["int32"], count, out.ptr, None)
        got = list(struct.unpack(f"<{count * world}i", out.read(0, 4 * count * world)))
        want = [v for s in range(world) for v in vals(s, rank)]
        results[f"all_to_all/{count}"] = None if rc == 0 and got == want else f"rc {rc}: {_last_message() if rc else ''} got {got[:8]}... want {want[:8]}..."
    rng = random.Random(7 + world)
    for skew in (False, True):
        for layout, experts, align, rb in ((ref.V, 1, 0, 16), (ref.V2D, 3, 4, 12), (ref.V2D, 2, 1, 8), (ref.V2D_OFFSET, 3, 0, 16)):
            call += 1
            tables = ref.random_tables(rng, layout, world, experts, skew)
            S = world * experts
            rows = ref.rows_needed(layout, tables, world, experts)
            out_rows = 12 * S + align * experts
            buf.write(ref.input_rows(call, rank, rows, rb))
            tab.write(struct.pack(f"<{len(tables[rank])}q", *tables[rank]))
            out.fill(0xEE, 0, out_rows * rb)
            so.fill(0xFF, 0, 16 * S)
            rc = _a2a_v(fns, h, layout, rb, experts, tab.ptr, out.ptr, out_rows, so.ptr, align)
            key = f"{ref.NAMES[layout]}/experts {experts}/align {align}/rows {rb}/{'skew' if skew else 'random'}"
            if rc != 0:
                results[key] = f"rc {rc}: {_last_message()}"
                continue
            splits, offsets, pieces = ref.expected(layout, tables, world, experts, align, rank)
            got = list(struct.unpack(f"<{2 * S}q", so.read(0, 16 * S)))
            if got != splits + offsets:
                results[key] = f"out_splits_offsets {got}, want {splits + offsets}"
                continue
            data = out.read(0, out_rows * rb)
            wrong = None
            written = [False] * out_rows
            for s, src, n, at in pieces:
                want = ref.input_rows(call, s, src + n, rb)[src * rb :]
                if data[at * rb : (at + n) * rb] != want:
                    wrong = f"rows {at}..{at + n} from rank {s}'s row {src}"
                for k in range(n):
                    written[at + k] = True
            if wrong is None:
                stray = [k for k in range(out_rows) if not written[k] and data[k * rb : (k + 1) * rb] != b"\xee" * rb]
                wrong = f"rows {stray[:5]} written but receiving nothing" if stray else None
            results[key] = wrong
    # The last rank (on the last machine) receives 5 rows from every rank,
    # the others 4, into outs of 4*world rows.
    call += 1
    last = world - 1
    table = [5 if p == last else 4 for p in range(world)]
    buf.write(bytes([rank + 1]) * 8 * sum(table))
    tab.write(struct.pack(f"<{world}q", *table))
    out.fill(0x5A, 0, 4096)
    rc = _a2a_v(fns, h, ref.V, 8, 1, tab.ptr, out.ptr, 4 * world, so.ptr, 0)
    if rank == last:
        msg = _last_message() if rc else ""
        ok = (rc == int(symmem.Result.INVALID_ARGUMENT) and f"rank {last} receives {5 * world} rows" in msg
              and out.read(0, 4096) == b"\x5a" * 4096)
        results["overrun"] = None if ok else f"rc {rc}: {msg}"
    else:
        want = b"".join(bytes([s + 1]) * 32 for s in range(world))
        results["overrun"] = None if rc == 0 and out.read(0, 32 * world) == want else f"rc {rc} on a rank that fits"
    h.barrier(timeout=TIMEOUT)
    for b in (out, tab, so):
        b.free()
    h.release()
    buf.free()
    g.destroy()
    nccl.ncclCommDestroy(ctypes.c_void_p(comm))
    return results
