"""Rank function of test_all_to_all.py's torch test (run by _mp.run_ranks):
symmem.torch's all-to-alls on tensors, on either backend (CPU tensors on
the host backend, CUDA tensors on cuda), and their argument checks. torch
is imported inside, so importing this module needs no torch."""

from __future__ import annotations

from typing import Dict, List

H = 4  # float32 columns: rows of 16 bytes
ROWS = 240  # input rows of every rank (equal splits: divides among 2, 3, 4 ranks)
OUT_ROWS = 512


def row_values(rank: int, row: int) -> List[float]:
    """Row `row` of rank's input: exact in float32, says whose row it is."""
    return [float(rank * 100000 + row * 16 + c) for c in range(H)]


def run(rank: int, world: int, init_file: str, splits_v, splits_2d, experts: int, major_align: int) -> Dict:
    import torch
    import torch.distributed as dist

    import symmem
    import symmem.torch as st

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    if symmem.backend_name() == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    rows, out_rows = ROWS, OUT_ROWS
    inp = st.empty(rows, H, dtype=torch.float32, device=dev)
    inp.copy_(torch.tensor([row_values(rank, r) for r in range(rows)], dtype=torch.float32))
    res: Dict = {}

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    # equal splits, a new out
    eq = st.all_to_all(inp)
    sync()
    res["equal"] = eq.cpu().tolist()
    # equal splits of a dtype libsymmem's collectives do not know (int64)
    ids = st.empty(world * 6, dtype=torch.int64, device=dev)
    ids.copy_(torch.arange(world * 6, dtype=torch.int64) + rank * 1000)
    ids_out = torch.empty_like(ids)
    assert st.all_to_all(ids, out=ids_out) is ids_out
    sync()
    res["equal_int64"] = ids_out.cpu().tolist()
    # v
    out = torch.full((out_rows, H), -1.0, dtype=torch.float32, device=dev)
    oso = torch.full((2, world), -7, dtype=torch.int64, device=dev)
    sp = torch.tensor(splits_v[rank], dtype=torch.int64, device=dev)
    assert st.all_to_all_v(inp, out, sp, oso) is None
    sync()
    res["v"] = (out.cpu().tolist(), oso.cpu().tolist())
    # 2-D dispatch, then the combine of what arrived (out of the dispatch is
    # the combine's symmetric input)
    mid = st.empty(out_rows, H, dtype=torch.float32, device=dev)
    mid.fill_(-1.0)
    oso2 = torch.full((2, world * experts), -7, dtype=torch.int64, device=dev)
    sp2 = torch.tensor(splits_2d[rank], dtype=torch.int64, device=dev)
    st.all_to_all_v_2d(inp, mid, sp2, oso2, major_align=major_align)
    sync()
    res["dispatch"] = (mid.cpu().tolist(), oso2.cpu().tolist())
    back = torch.full((out_rows, H), -1.0, dtype=torch.float32, device=dev)
    oso3 = torch.full((2, world * experts), -7, dtype=torch.int64, device=dev)
    st.all_to_all_v_2d_offset(mid, back, oso2, oso3, group=dist.group.WORLD)
    sync()
    res["combine"] = (back.cpu().tolist(), oso3.cpu().tolist())

    # What is checked before anything runs: each message names the argument.
    bad = {}
    i32 = torch.zeros(world, dtype=torch.int32, device=dev)
    checks = {
        "in_splits_dtype": lambda: st.all_to_all_v(inp, out, i32, oso),
        "in_splits_shape": lambda: st.all_to_all_v(inp, out, torch.zeros(world + 1, dtype=torch.int64, device=dev), oso),
        "oso_shape": lambda: st.all_to_all_v(inp, out, sp, torch.zeros(world, dtype=torch.int64, device=dev)),
        "out_dtype": lambda: st.all_to_all_v(inp, out.double(), sp, oso),
        "out_rows": lambda: st.all_to_all_v(inp, torch.zeros(8, H + 1, device=dev), sp, oso),
        "out_contiguous": lambda: st.all_to_all_v(inp, torch.zeros(16, H, device=dev)[:, ::2], sp, oso),
        "input_contiguous": lambda: st.all_to_all_v(inp.t(), out, sp, oso),
        "experts": lambda: st.all_to_all_v_2d(inp, mid, torch.zeros(world * experts + 1, dtype=torch.int64,
                                                                     device=dev), oso2),
        "major_align": lambda: st.all_to_all_v_2d(inp, mid, sp2, oso2, major_align=0),
        "offsets_shape": lambda: st.all_to_all_v_2d_offset(mid, back, sp2, oso3),
        "oso_contiguous": lambda: st.all_to_all_v(inp, out, sp, torch.zeros(world, 2, dtype=torch.int64,
                                                                            device=dev).t()),
        "equal_out": lambda: st.all_to_all(inp, out=torch.zeros(3, device=dev)),
    }
    if dev.type == "cuda":
        checks["device"] = lambda: st.all_to_all_v(inp, out, sp.cpu(), oso)
    for name, call in checks.items():
        try:
            call()
            bad[name] = None
        except ValueError as exc:
            bad[name] = str(exc)
    res["bad"] = bad
    dist.barrier()
    dist.destroy_process_group()
    return res


def compile_graph(rank: int, world: int, init_file: str) -> Dict:
    """torch.compile(fullgraph=True) of an MoE exchange through a backend
    that keeps the traced graph and runs nothing: the operators and their
    fake implementations, without a kernel. Returns the graphs' code, what
    a fake refuses and the shape a fake all_to_all gives."""
    import torch
    import torch.distributed as dist

    import symmem.torch as st

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    st.register_ops()
    graphs = []

    class NotRun(Exception):
        pass

    def keep(gm, example_inputs):
        graphs.append(gm)

        def never(*args):
            raise NotRun()

        return never

    def exchange(x, mid, back, sp, oso_d, oso_c, eq):
        st.all_to_all_v_2d(x, mid, sp, oso_d, major_align=16)
        mid.mul_(3.0)
        st.all_to_all_v_2d_offset(mid, back, oso_d, oso_c)
        st.all_to_all_v(x, back, sp[:world], oso_c[:, :world].contiguous())
        return back.sum(dim=1) + st.all_to_all(eq).sum()

    S = world * 2
    args = (torch.zeros(16, 4), torch.zeros(64, 4), torch.zeros(64, 4), torch.zeros(S, dtype=torch.int64),
            torch.zeros(2, S, dtype=torch.int64), torch.zeros(2, S, dtype=torch.int64), torch.zeros(8 * world))
    try:
        torch.compile(exchange, fullgraph=True, backend=keep)(*args)
    except NotRun:
        pass
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        x, mid, sp = (mode.from_tensor(a) for a in (args[0], args[1], args[3]))
        try:
            torch.ops.symmem.all_to_all_v_2d(x, mid, sp, mode.from_tensor(torch.zeros(2, 3, dtype=torch.int64)), "", 1)
            refused = None
        except ValueError as exc:
            refused = str(exc)
        gathered = tuple(torch.ops.symmem.all_to_all(mode.from_tensor(args[6]), "").shape)
    dist.destroy_process_group()
    return {"graphs": [g.code for g in graphs], "refused": refused, "all_to_all_shape": gathered}
