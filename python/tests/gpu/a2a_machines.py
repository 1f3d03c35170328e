"""The all-to-alls across machines on GPUs, run by test_nccl_gpu.py: each
rank (one GPU each) claims a machine of its own (SYMMEM_MACHINE_ID, a
socket directory per machine, NCCL_HOSTID, so that NCCL too sees two
hosts; its P2P and SHM transports left on), on a communicator made here
with ncclCommInitRank over torch's libnccl. Every form crosses through
NCCL's ncclSend/ncclRecv (Note [All-to-all across machines] in
core/symm/coll): equal splits (eager and replayed from a CUDA graph), the
v, dispatch and combine forms with zero splits and everything for rank 0,
against _a2a_machines_ref; the last rank's overrun fails it alone, naming it.
"""

from __future__ import annotations

import ctypes
import os
import random
import struct
import sys

# This rank's imitated machine. libsymmem (a Go library) reads the
# environment the process started with, not what os.environ changes later,
# so the rank starts itself again with it when it lacks it.
_RANK = int(os.environ["SYMM_RANK"])
_SOCK = os.path.join(os.environ["SYMM_OUT"], f"sock-m{_RANK}")
os.makedirs(_SOCK, mode=0o700, exist_ok=True)
_MACHINE = {"SYMMEM_MACHINE_ID": f"m{_RANK}", "NCCL_HOSTID": f"symmem-a2a-m{_RANK}", "SYMMEM_SOCKET_DIR": _SOCK}
if any(os.environ.get(k) != v for k, v in _MACHINE.items()) or "NCCL_P2P_DISABLE" in os.environ or "NCCL_SHM_DISABLE" in os.environ:
    _env = {k: v for k, v in os.environ.items() if k not in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE")}
    _env.update(_MACHINE)
    os.execve(sys.executable, [sys.executable] + sys.argv, _env)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: _a2a_machines_ref

import _a2a_machines_ref as ref  # noqa: E402
from _symm_common import guarded, run  # noqa: E402
from nccl_torch import UniqueId, loaded_nccl  # noqa: E402


def _functions():
    import symmem._lib as _lib

    lib = _lib.lib()
    names = ("symmem_all_to_all", "symmem_all_to_all_v", "symmem_all_to_all_v_2d", "symmem_all_to_all_v_2d_offset")
    return {name: getattr(lib, name) for name in names}


def _comm(ctx, dist):
    lib = ctypes.CDLL(loaded_nccl())
    store = dist.distributed_c10d._get_default_store()
    key = f"{ctx.name}/a2a-nccl-uid"
    uid = UniqueId()
    if ctx.rank == 0:
        assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
        store.set(key, ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid)))
    raw = store.get(key)
    ctypes.memmove(ctypes.addressof(uid), raw, len(raw))
    comm = ctypes.c_void_p()
    ctx.stage("ncclCommInitRank (one host per rank: NCCL_HOSTID)")
    rc = lib.ncclCommInitRank(ctypes.byref(comm), ctx.world, uid, ctx.rank)
    if rc != 0:
        raise RuntimeError(f"ncclCommInitRank: {rc}")
    return lib, comm


def part_a2a(ctx, dist):
    torch = ctx.torch
    import symmem
    import symmem.torch as st
    from symmem._lib import _last_message

    world, me = ctx.world, ctx.rank
    symmem.nccl_version()  # loads NCCL (torch's) if torch has not
    lib, comm = _comm(ctx, dist)
    g = symmem.Group.from_nccl(comm.value, f"{ctx.name}-a2a", timeout=ctx.timeout)
    out = {"machines": [g.local_size, [g.is_local(r) for r in range(world)]]}
    fns = _functions()

    ctx.stage("all_to_all, equal splits")
    count = 1000
    x = st.empty(world * count, dtype=torch.int32, device=ctx.dev)
    hx = st.rendezvous(x, g, timeout=ctx.timeout)
    y = torch.full((world * count,), -1, dtype=torch.int32, device=ctx.device)
    idx = torch.arange(count, dtype=torch.int32, device=ctx.device)

    def fill(call):
        x.copy_(torch.cat([me * 100000 + p * 1000 + (idx + call) % 997 for p in range(world)]))

    def want(call):
        return torch.cat([s * 100000 + me * 1000 + (idx + call) % 997 for s in range(world)])

    def equal():
        return fns["symmem_all_to_all"](hx.handle._ptr, symmem._enums.DTYPES["int32"], count, y.data_ptr(), ctx.cur())

    fill(1)
    rc = equal()
    ctx.sync("all_to_all")
    out["equal"] = f"rc {rc}: {_last_message()}" if rc else (None if bool(torch.equal(y, want(1))) else "wrong values")

    ctx.stage("all_to_all captured in a CUDA graph")
    side = torch.cuda.Stream(ctx.device)
    side.wait_stream(torch.cuda.current_stream(ctx.device))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph, stream=side):
            rc = equal()
    ctx.sync("capture")
    res = f"capture rc {rc}: {_last_message()}" if rc else None
    for call in (2, 3):
        fill(call)
        y.fill_(-1)
        graph.replay()
        ctx.sync(f"replay {call}")
        if res is None and not bool(torch.equal(y, want(call))):
            res = f"replay {call}: wrong values"
    out["graph"] = res
    del graph

    ctx.stage("the split-driven forms")
    nbytes = 1 << 20
    t = st.empty(nbytes, dtype=torch.uint8, device=ctx.dev)
    ht = st.rendezvous(t, g, timeout=ctx.timeout)
    o = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)
    tab = torch.zeros(4096, dtype=torch.int64, device=ctx.device)
    so = torch.zeros(4096, dtype=torch.int64, device=ctx.device)

    def v_call(layout, rb, experts, table, out_rows, align):
        tab[: len(table)].copy_(torch.tensor(table, dtype=torch.int64))
        h, s = ht.handle._ptr, ctx.cur()
        if layout == ref.V:
            return fns["symmem_all_to_all_v"](h, rb, tab.data_ptr(), o.data_ptr(), out_rows, so.data_ptr(), s)
        if layout == ref.V2D:
            return fns["symmem_all_to_all_v_2d"](h, rb, experts, tab.data_ptr(), o.data_ptr(), out_rows, so.data_ptr(), align, s)
        return fns["symmem_all_to_all_v_2d_offset"](h, rb, experts, tab.data_ptr(), o.data_ptr(), out_rows, so.data_ptr(), s)

    rng = random.Random(7 + world)
    call = 10
    for skew in (False, True):
        for layout, experts, align, rb in ((ref.V, 1, 0, 16), (ref.V2D, 3, 4, 12), (ref.V2D, 2, 64, 8), (ref.V2D_OFFSET, 3, 0, 16)):
            call += 1
            tables = ref.random_tables(rng, layout, world, experts, skew)
            S = world * experts
            rows = ref.rows_needed(layout, tables, world, experts)
            out_rows = 12 * S + align * experts
            if rows:
                t[: rows * rb].copy_(torch.frombuffer(bytearray(ref.input_rows(call, me, rows, rb)), dtype=torch.uint8))
            o.fill_(0xEE)
            rc = v_call(layout, rb, experts, tables[me], out_rows, align)
            ctx.sync(f"call {call}")
            key = f"{ref.NAMES[layout]}/experts {experts}/align {align}/{'skew' if skew else 'random'}"
            if rc:
                out[key] = f"rc {rc}: {_last_message()}"
                continue
            splits, offsets, pieces = ref.expected(layout, tables, world, experts, align, me)
            got = so[: 2 * S].cpu().tolist()
            if got != splits + offsets:
                out[key] = f"out_splits_offsets {got}, want {splits + offsets}"
                continue
            data = bytes(o[: out_rows * rb].cpu().tolist())
            wrong = None
            for s, src, n, at in pieces:
                if data[at * rb : (at + n) * rb] != ref.input_rows(call, s, src + n, rb)[src * rb :]:
                    wrong = f"rows {at}..{at + n} from rank {s}'s row {src}"
            out[key] = wrong

    ctx.stage("overrun on the last rank")
    last = world - 1
    table = [5 if p == last else 4 for p in range(world)]
    t[: 8 * sum(table)].fill_(me + 1)
    o[:4096].fill_(0x5A)
    rc = v_call(ref.V, 8, 1, table, 4 * world, 0)
    ctx.sync("overrun")
    msg = _last_message() if rc else ""
    if me == last:
        ok = rc == int(symmem.Result.INVALID_ARGUMENT) and f"rank {last} receives {5 * world} rows" in msg and bool(torch.all(o[:4096] == 0x5A))
    else:
        want_rows = bytes(b"".join(bytes([s + 1]) * 32 for s in range(world)))
        ok = rc == 0 and bytes(o[: 32 * world].cpu().tolist()) == want_rows
    out["overrun"] = None if ok else f"rc {rc}: {msg}"

    for h in (hx, ht):
        h.release()
    del x, t
    torch.cuda.synchronize(ctx.device)
    g.destroy()
    ctx.stage("ncclCommDestroy")
    lib.ncclCommDestroy(comm)
    return out


def body(ctx):
    dist = ctx.init_dist()
    res = {"a2a": guarded(ctx, lambda: part_a2a(ctx, dist))}
    dist.barrier()
    dist.destroy_process_group()
    return res


if __name__ == "__main__":
    run(body)
