"""Rank functions for test_staging.py (run by _mp.run_ranks): symmem.torch's
collectives on tensors that libsymmem did not allocate (Note [Staging] in
symmem/torch.py), and the same calls under torch.compile, on the host
backend's CPU tensors. torch is imported inside the functions.
"""

from __future__ import annotations

from typing import Dict


def _init(rank: int, world: int, init_file: str):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    return torch, dist


def _inputs(torch, world: int, n: int, dtype):
    """Every rank's input (small integers: sums are exact in any dtype)."""
    return [((torch.arange(n) * (r + 3) + r) % 17).to(dtype) for r in range(world)]


def any_tensor(rank: int, world: int, init_file: str) -> Dict:
    """Each collective on plain torch tensors, beside the same call on a
    libsymmem tensor; the workspace's growth; a non-contiguous input."""
    torch, dist = _init(rank, world, init_file)
    import symmem
    import symmem.torch as st

    res: Dict = {}
    xs = _inputs(torch, world, 1000, torch.float32)
    want_sum = sum(xs)
    # all_reduce in place on x * 2: the tensor is torch's, not libsymmem's.
    x = xs[rank] * 2
    assert not symmem._lib.calls().is_symmem(x.data_ptr())
    r = st.all_reduce(x)
    res["in_place_same_tensor"] = r.data_ptr() == x.data_ptr()
    res["in_place"] = bool(torch.equal(x, want_sum * 2))
    # inplace=False: a new tensor, the argument untouched.
    y = xs[rank].clone()
    f = st.all_reduce(y, "max", inplace=False)
    res["functional_new"] = f.data_ptr() != y.data_ptr()
    res["functional"] = bool(torch.equal(f, torch.stack(xs).max(0).values))
    res["functional_untouched"] = bool(torch.equal(y, xs[rank]))
    # out= on a plain tensor
    out = torch.empty(1000)
    st.all_reduce(xs[rank].clone(), out=out)
    res["out"] = bool(torch.equal(out, want_sum))
    # The zero-copy path stays for a libsymmem tensor.
    t = st.empty(1000)
    t.copy_(xs[rank])
    st.all_reduce(t)
    res["zero_copy"] = bool(torch.equal(t, want_sum))
    res["zero_copy_rendezvoused"] = any(k[2] == t.data_ptr() for k in st._fast)
    # all_gather, reduce_scatter, all_to_all on plain tensors; bf16, int32
    xb = _inputs(torch, world, 64 * world, torch.bfloat16)
    g = st.all_gather(xb[rank].view(world, 64))
    res["all_gather"] = bool(torch.equal(g, torch.cat([v.view(world, 64) for v in xb])))
    xi = _inputs(torch, world, 64 * world, torch.int32)
    rs = st.reduce_scatter(xi[rank])
    res["reduce_scatter"] = bool(torch.equal(rs, sum(xi)[rank * 64:(rank + 1) * 64]))
    a2a = st.all_to_all(xi[rank].clone())
    res["all_to_all"] = bool(torch.equal(a2a, torch.cat([xi[p][rank * 64:(rank + 1) * 64] for p in range(world)])))
    # all_to_all_v with a plain input: 2 rows of 4 to every rank.
    rows_in = torch.tensor([[rank * 100 + p * 10 + r] * 4 for p in range(world) for r in range(2)],
                           dtype=torch.float32)
    splits = torch.full((world,), 2, dtype=torch.int64)
    out_v = torch.full((4 * world, 4), -1.0)
    oso = torch.zeros(2, world, dtype=torch.int64)
    st.all_to_all_v(rows_in, out_v, splits, oso)
    got_rows = {s_: out_v[int(oso[1][s_]):int(oso[1][s_]) + int(oso[0][s_]), 0].tolist() for s_ in range(world)}
    res["all_to_all_v"] = got_rows == {s_: [float(s_ * 100 + rank * 10 + r) for r in range(2)] for s_ in range(world)}
    # A non-contiguous tensor (a transposed view) is staged too.
    m = torch.stack([xs[rank][:100]] * 3).t()  # (100, 3), stride (1, 100)
    st.all_reduce(m)
    res["non_contiguous"] = bool(torch.equal(m, torch.stack([want_sum[:100]] * 3).t()))
    # Growth: more than the first size (SYMMEM_STAGING_BYTES=4K here).
    g_ = st.group_for(None, 0)
    first = st._workspaces[id(g_)].nbytes
    big = _inputs(torch, world, 5000, torch.float32)
    bx = big[rank].clone()
    st.all_reduce(bx)
    res["grown_from"] = first
    res["grown_to"] = st._workspaces[id(g_)].nbytes
    res["grown_kept"] = len(st._workspaces[id(g_)].outgrown)
    res["grown"] = bool(torch.equal(bx, sum(big)))
    # An unsupported dtype is refused naming the dtypes that work.
    try:
        st.all_reduce(torch.ones(8, dtype=torch.float64))
        res["float64"] = None
    except symmem.InvalidArgumentError as exc:
        res["float64"] = str(exc)
    dist.barrier()
    dist.destroy_process_group()
    return res


def compiled(rank: int, world: int, init_file: str, backend: str) -> Dict:
    """torch.compile(fullgraph=True) of the three patterns (an argument of
    libsymmem memory reduced in place, a module's libsymmem buffer written
    and reduced, a plain intermediate), each against the eager result."""
    torch, dist = _init(rank, world, init_file)
    import symmem.torch as st

    res: Dict = {}
    xs = _inputs(torch, world, 256, torch.float32)
    want = sum(xs)

    def argument(t):
        st.all_reduce(t)
        return t * 2 + 1

    class WithBuffer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("buf", st.empty(256))

        def forward(self, x):
            self.buf.copy_(x)
            st.all_reduce(self.buf)
            return self.buf * 3 - 1

    def intermediate(x):
        y = st.all_reduce(x * 2, inplace=False)
        z = st.all_reduce(y + 1)  # in place on an intermediate
        return z - 1

    torch._dynamo.reset()
    t = st.empty(256)
    t.copy_(xs[rank])
    got = torch.compile(argument, fullgraph=True, backend=backend)(t)
    res["argument"] = bool(torch.equal(got, want * 2 + 1)) and bool(torch.equal(t, want))
    mod = WithBuffer()
    got = torch.compile(mod, fullgraph=True, backend=backend)(xs[rank])
    res["module_buffer"] = bool(torch.equal(got, want * 3 - 1))
    res["module_buffer_written"] = bool(torch.equal(mod.buf, want))
    got = torch.compile(intermediate, fullgraph=True, backend=backend)(xs[rank])
    res["intermediate"] = bool(torch.equal(got, (want * 2 + 1) * world - 1))
    # A second call of each compiled function: the same results again.
    t.copy_(xs[rank])
    res["argument_again"] = bool(torch.equal(torch.compile(argument, fullgraph=True, backend=backend)(t), want * 2 + 1))

    # all_reduce_rmsnorm (mutating residual and out) on a libsymmem x: the
    # compiled call gives eager's bits, residual updated as eagerly.
    def norm(x, residual, weight):
        out, res2 = st.all_reduce_rmsnorm(x, residual, weight, 1e-6)
        return out * 2, res2 + 0

    gen = torch.Generator().manual_seed(11)
    x0 = torch.randn(4, 64, generator=gen) * (rank + 1)
    r0, w0 = torch.randn(4, 64, generator=gen), torch.rand(64, generator=gen) + 0.5
    nx = st.empty(4, 64)
    nx.copy_(x0)
    r_eager = r0.clone()
    want_out, want_res = norm(nx, r_eager, w0)
    compiled_norm = torch.compile(norm, fullgraph=True, backend=backend)
    ok = True
    for _ in range(2):
        nx.copy_(x0)
        r_c = r0.clone()
        got_out, got_res = compiled_norm(nx, r_c, w0)
        ok = ok and bool(torch.equal(got_out, want_out)) and bool(torch.equal(got_res, want_res))
        ok = ok and bool(torch.equal(r_c, r_eager))
    res["rmsnorm"] = ok
    dist.barrier()
    dist.destroy_process_group()
    return res


def compiled_first(rank: int, world: int, init_file: str) -> Dict:
    """A compiled function that is the process's first use of
    symmem.torch: the operators were registered when the module was
    imported, so tracing the call meets no registration (and no graph
    break)."""
    torch, dist = _init(rank, world, init_file)
    import symmem.torch as st

    xs = _inputs(torch, world, 256, torch.float32)

    def step(x):
        return st.all_reduce(x * 2, inplace=False) + 1

    got = torch.compile(step, fullgraph=True, backend="aot_eager")(xs[rank])
    res = {"first_call_compiled": bool(torch.equal(got, sum(xs) * 2 + 1))}
    dist.barrier()
    dist.destroy_process_group()
    return res


def cpp_kernels(rank: int, world: int, init_file: str) -> Dict:
    """The all-reduce operators' C++ kernels (Note [Operators in C++] in
    symmem/torch.py): the first call on a tensor passes to Python, later
    ones are answered from the table, staged calls included; a libsymmem
    tensor's entries go with its memory and every entry with destroy_group;
    the library's failures are raised with their own error."""
    import gc

    torch, dist = _init(rank, world, init_file)
    import symmem.torch as st

    ops = torch.ops.symmem
    res: Dict = {"loaded": st.cpp_ops_info()["loaded"] is not None}
    xs = _inputs(torch, world, 256, torch.float32)
    want = sum(xs)

    def stats():
        i = st.cpp_ops_info()
        return i["answered"], i["passed_to_python"], i["entries"]

    a0, p0, _ = stats()
    t = st.empty(256)
    ok = True
    for _ in range(3):
        t.copy_(xs[rank])
        ops.all_reduce_(t, "sum", "", "auto")
        ok = ok and bool(torch.equal(t, want))
    a1, p1, e1 = stats()
    res["in_place"] = ok
    res["in_place_counts"] = (a1 - a0, p1 - p0, e1)
    # out= and the functional form on the same tensor: the same entry.
    out = torch.empty(256)
    t.copy_(xs[rank])
    ops.all_reduce_out(t, out, "max", "", "auto")
    f = ops.all_reduce(t, "sum", "", "one_shot")
    a2, p2, _ = stats()
    res["out_max"] = bool(torch.equal(out, torch.stack(xs).max(0).values))
    res["functional"] = bool(torch.equal(f, want)) and bool(torch.equal(t, xs[rank]))
    res["out_functional_counts"] = (a2 - a1, p2 - p1)
    # all_gather and reduce_scatter, functional and out=: the first call of
    # each form's collective passes to Python, the rest are answered.
    ag_in = st.empty(2, 8)
    ag_in.copy_(xs[rank][:16].view(2, 8))
    ag_want = torch.cat([x[:16].view(2, 8) for x in xs])
    rs_in = st.empty(4 * world, 4)
    rs_in.copy_(xs[rank][:16 * world].view(4 * world, 4))
    rs_want = sum(x[:16 * world].view(4 * world, 4) for x in xs)[4 * rank:4 * rank + 4]
    b0 = stats()
    gathered = [ops.all_gather(ag_in, "") for _ in range(2)]
    ag_out = torch.empty(2 * world, 8)
    ops.all_gather_out(ag_in, ag_out, "")
    scattered = [ops.reduce_scatter(rs_in, "sum", "") for _ in range(2)]
    rs_out = torch.empty(4, 4)
    ops.reduce_scatter_out(rs_in, rs_out, "sum", "")
    b1 = stats()
    res["all_gather"] = all(bool(torch.equal(g, ag_want)) for g in gathered + [ag_out])
    res["reduce_scatter"] = all(bool(torch.equal(r, rs_want)) for r in scattered + [rs_out])
    res["ag_rs_counts"] = (b1[0] - b0[0], b1[1] - b0[1], b1[2] - b0[2])
    del ag_in, rs_in, gathered, scattered
    a2, p2, _ = stats()
    # all_reduce_rmsnorm on a libsymmem x: the same bits as the Python
    # kernel's, the first call passed on, the next ones answered.
    nx = st.empty(2, 64)
    gen = torch.Generator().manual_seed(7)
    x0 = torch.randn(2, 64, generator=gen) * (rank + 1)
    r0, w0 = torch.randn(2, 64, generator=gen), torch.rand(64, generator=gen) + 0.5
    n0 = stats()
    norm_ok = True
    for _ in range(3):
        nx.copy_(x0)
        r_cpp, r_py = r0.clone(), r0.clone()
        o_cpp, o_py = torch.empty(2, 64), torch.empty(2, 64)
        ops.all_reduce_rmsnorm(nx, r_cpp, w0, 1e-6, o_cpp, "", "auto")
        nx.copy_(x0)
        ops._py_all_reduce_rmsnorm(nx, r_py, w0, 1e-6, o_py, "", "auto")
        norm_ok = norm_ok and bool(torch.equal(o_cpp, o_py)) and bool(torch.equal(r_cpp, r_py))
    n1 = stats()
    res["norm"] = norm_ok
    res["norm_counts"] = (n1[0] - n0[0], n1[1] - n0[1])
    del nx
    # The split-driven all-to-alls on a libsymmem input: what the Python
    # kernel gives, the first call of each passed on.
    a2a_in = st.empty(4 * world, 4)
    a2a_in.copy_(torch.arange(16 * world, dtype=torch.float32).view(4 * world, 4) + 100 * rank)
    splits = torch.full((world,), 4, dtype=torch.int64)
    splits2d = torch.full((2 * world,), 2, dtype=torch.int64)
    offs2d = torch.stack([torch.full((2 * world,), 2, dtype=torch.int64), torch.arange(2 * world) * 2])
    q0 = stats()
    a2a_ok = True
    for _ in range(2):
        for cpp, py, extra in ((ops.all_to_all_v, ops._py_all_to_all_v, (splits,)),
                               (ops.all_to_all_v_2d, ops._py_all_to_all_v_2d, (splits2d,)),
                               (ops.all_to_all_v_2d_offset, ops._py_all_to_all_v_2d_offset, (offs2d,))):
            got = []
            for fn in (cpp, py):
                o, so = torch.full((4 * world, 4), -1.0), torch.zeros((2, extra[0].shape[-1]), dtype=torch.int64)
                args = (a2a_in, o, extra[0], so, "")
                if cpp is ops.all_to_all_v_2d:
                    fn(*args, 1)  # major_align
                else:
                    fn(*args)
                got.append((o, so))
                del args
            a2a_ok = a2a_ok and torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])
            a2a_ok = a2a_ok and bool((got[0][0] >= 0).all())
    # all_to_all, functional and out=, in a dtype of the library's and in
    # int64 (moved as int32 words): the first call of each passes on.
    for dt in (torch.float32, torch.int64):
        e_in = st.empty(4 * world, 2, dtype=dt)
        e_in.copy_((torch.arange(8 * world).view(4 * world, 2) + 1000 * rank).to(dt))
        want_e = torch.empty_like(e_in)
        ops._py_all_to_all_out(e_in, want_e, "")
        got_f = [ops.all_to_all(e_in, "") for _ in range(2)]
        got_o = torch.empty_like(e_in)
        ops.all_to_all_out(e_in, got_o, "")
        a2a_ok = a2a_ok and all(bool(torch.equal(g, want_e)) for g in got_f + [got_o])
        a2a_ok = a2a_ok and bool(torch.equal(want_e[:4], (torch.arange(8).view(4, 2) + 8 * rank).to(dt)))
        del e_in
    q1 = stats()
    res["a2a"] = a2a_ok
    res["a2a_counts"] = (q1[0] - q0[0], q1[1] - q0[1])
    del a2a_in
    gc.collect()
    a2, p2, _ = stats()
    # Tensors of torch's memory: staged on the host backend (no low-latency
    # path). The first staged call passes to Python, which enters it and
    # the group's workspace; every later one is staged by the C++ kernel,
    # on tensors it has not seen too (decided from the workspace): the
    # functional, in-place and out= all-reduces (two_shot on an entered
    # tensor: the result reduced in the workspace and copied back),
    # all_gather and reduce_scatter, each equal to the Python kernel's
    # result. A libsymmem tensor it has not seen still passes to Python,
    # whose first call rendezvouses it.
    e2 = stats()[2]
    x = xs[rank].clone()
    g = [ops.all_reduce(x, "sum", "", "auto") for _ in range(2)]
    g.append(ops.all_reduce(x, "sum", "", "two_shot"))
    y = torch.empty(256)
    for _ in range(2):
        y.copy_(xs[rank])
        ops.all_reduce_(y, "sum", "", "auto")
        g.append(y.clone())
    y_out = torch.full((256,), -1.0)
    for _ in range(2):
        ops.all_reduce_out(x, y_out, "max", "", "auto")
    ag_x = ag_want[2 * rank:2 * rank + 2].clone()
    rs_x = xs[rank][:16 * world].view(4 * world, 4).clone()
    staged_ag = [ops.all_gather(ag_x, "") for _ in range(2)]
    staged_rs = [ops.reduce_scatter(rs_x, "sum", "") for _ in range(2)]
    fresh = st.empty(256)
    fresh.copy_(xs[rank])
    ops.all_reduce_(fresh, "sum", "", "auto")
    res["fresh_symmem"] = bool(torch.equal(fresh, want))
    a3, p3, e3 = stats()
    res["staged"] = (all(bool(torch.equal(v, want)) for v in g) and bool(torch.equal(x, xs[rank]))
                     and bool(torch.equal(y_out, torch.stack(xs).max(0).values))
                     and all(bool(torch.equal(v, ag_want)) for v in staged_ag)
                     and all(bool(torch.equal(v, rs_want)) for v in staged_rs))
    res["staged_counts"] = (a3 - a2, p3 - p2, e3 - e2)
    # An unknown op is refused with the Python side's error.
    try:
        ops.all_reduce_(t, "bogus", "", "auto")
        res["bogus"] = "no error"
    except Exception as exc:  # noqa: BLE001 - the message is the result
        res["bogus"] = f"{type(exc).__name__}: {exc}"
    # The tensor's entries go with its memory.
    del t, f
    gc.collect()
    res["entries_after_free"] = stats()[2]
    # destroy_group empties the table; a new tensor enters it again.
    t2 = st.empty(256)
    t2.copy_(xs[rank])
    ops.all_reduce_(t2, "sum", "", "auto")
    res["entries_before_destroy"] = stats()[2]
    st.destroy_group()
    res["entries_after_destroy"] = stats()[2]
    t3 = st.empty(256)
    t3.copy_(xs[rank])
    ops.all_reduce_(t3, "sum", "", "auto")
    ops.all_reduce_(t3, "sum", "", "auto")
    res["after_destroy"] = bool(torch.equal(t3, want * world))
    # The workspaces went with it: a tensor of torch's memory not seen
    # before passes to Python again (which makes the group's new
    # workspace and enters it); the next one is staged in C++.
    d0 = stats()
    u, v = xs[rank].clone(), xs[rank].clone()
    ops.all_reduce_(u, "sum", "", "auto")
    ops.all_reduce_(v, "sum", "", "auto")
    d1 = stats()
    res["torch_memory_after_destroy"] = bool(torch.equal(u, want) and torch.equal(v, want))
    res["torch_memory_after_destroy_counts"] = (d1[0] - d0[0], d1[1] - d0[1])
    # A failure of the library on a call from the table: abort makes the
    # next call fail, raised as AbortedError by the Python side.
    dist.barrier()
    st.abort()
    try:
        ops.all_reduce_(t3, "sum", "", "auto")
        res["aborted"] = "no error"
    except Exception as exc:  # noqa: BLE001 - the message is the result
        res["aborted"] = f"{type(exc).__name__}: {exc}"
    return res


def cpp_kernels_off(rank: int, world: int, init_file: str) -> Dict:
    """SYMMEM_TORCH_OPS=0: the Python kernels serve the operators."""
    torch, dist = _init(rank, world, init_file)
    import symmem.torch as st

    xs = _inputs(torch, world, 256, torch.float32)
    t = st.empty(256)
    t.copy_(xs[rank])
    torch.ops.symmem.all_reduce_(t, "sum", "", "auto")
    res = {"loaded": st.cpp_ops_info()["loaded"], "sum": bool(torch.equal(t, sum(xs)))}
    dist.barrier()
    dist.destroy_process_group()
    return res
