"""symmem.torch's collectives on any tensor and under torch.compile in every
mode (the patterns a PyTorch model uses), each compiled with fullgraph=True (a graph
break raises) and run three times with new inputs (compile and warm-up,
CUDA-graph recording, replay), every result against the eager one:

- argument: a tensor of symmem.torch.empty reduced in place (zero-copy),
  marked as a static address for reduce-overhead (a mutated input that is
  not static is never captured); and the functional form on it;
- module buffer: a module keeps a symmem.torch.empty buffer, copies the
  input into it and all-reduces it in place;
- plain intermediate: all_reduce (functional and in place), all_gather and
  reduce_scatter of x * 2 (torch's memory: 4 KiB, read where it lies);
- the same on 512 KiB per rank (intermediate_staged: past the low-latency
  buffers, copied through the staging workspace), where the operators'
  C++ kernels stage the calls they have seen (counted per mode);

in modes default, reduce-overhead (torch._inductor.config.triton.
cudagraph_or_error: a "skipping cudagraphs" raises, with its reason) and
max-autotune-no-cudagraphs. Then eager staging: any tensor, a
non-contiguous one, small calls that read the tensor where it lies (the
workspace untouched, eager and replayed), growth of the workspace, and the
error inside CUDA-graph capture when it would have to grow.
"""

from __future__ import annotations

from _symm_common import first_mismatch, run


def body(ctx):
    torch = ctx.torch
    import symmem.torch as st

    # A rank may wait at a barrier or in a collective while its peer still
    # compiles: minutes, not the launcher's usual seconds.
    ctx.dist_timeout = max(ctx.dist_timeout, 600)
    ctx.timeout = max(ctx.timeout, 600)
    dist = ctx.init_dist()
    W, me, dev = ctx.world, ctx.rank, ctx.device
    st.group_for(None, ctx.dev, timeout=600)  # the group every call below uses, with the kernels' wait bound
    n = 2048
    # A "skipping cudagraphs" raises (with its reason) instead of a warning.
    torch._inductor.config.triton.cudagraph_or_error = True

    def inp(step, count=n):  # every rank's input of a step: small integers, exact in bf16 sums
        return [((torch.arange(count, device=dev) * (r + 1) + step) % 9).to(torch.bfloat16) for r in range(W)]

    n_staged = 256 * 1024  # 512 KiB of bf16 per rank: past the low-latency buffers (256 KiB)

    class Buffered(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("buf", st.empty(n, dtype=torch.bfloat16, device=dev))

        def forward(self, x):
            self.buf.copy_(x)
            st.all_reduce(self.buf)
            return self.buf * 2 + 1

    def argument(t):
        st.all_reduce(t)
        return t * 2 + 1

    def argument_functional(t):
        return st.all_reduce(t, inplace=False) * 2 + 1

    def intermediate(x):
        y = st.all_reduce(x * 2, inplace=False)
        z = x + 1
        st.all_reduce(z)
        g = st.all_gather(x * 3)
        r = st.reduce_scatter(x - 1)
        return y + z, g, r

    def want_of(xs, pattern):
        s = sum(x.float() for x in xs)
        if pattern == "intermediate":
            k = xs[0].numel() // W
            return (s * 2 + (s + W), torch.cat([x * 3 for x in xs]), (s - W)[me * k:(me + 1) * k])
        return s * 2 + 1

    def cpp_counts():
        i = st.cpp_ops_info()
        return (i.get("answered", 0), i.get("passed_to_python", 0))

    out = {}
    for mode in ("default", "reduce-overhead", "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        t_arg = st.empty(n, dtype=torch.bfloat16, device=dev)
        if mode == "reduce-overhead":
            torch._dynamo.mark_static_address(t_arg)
        mod = Buffered()
        fns = {
            "argument": torch.compile(argument, fullgraph=True, mode=mode),
            "argument_functional": torch.compile(argument_functional, fullgraph=True, mode=mode),
            "module_buffer": torch.compile(mod, fullgraph=True, mode=mode),
            "intermediate": torch.compile(intermediate, fullgraph=True, mode=mode),
            "intermediate_staged": torch.compile(intermediate, fullgraph=True, mode=mode),
        }
        for pattern, fn in fns.items():
            key = f"{mode}/{pattern}"
            ctx.stage(key)
            got_all = []
            before = cpp_counts()
            try:
                for step in range(3):
                    xs = inp(step, n_staged if pattern == "intermediate_staged" else n)
                    if pattern.startswith("argument"):
                        t_arg.copy_(xs[me])
                        got = fn(t_arg)
                    else:
                        got = fn(xs[me])
                    got = tuple(g.float().clone() for g in got) if isinstance(got, tuple) else (got.float().clone(),)
                    ctx.wait_gpu(key)
                    want = want_of(xs, "intermediate" if pattern.startswith("intermediate") else "step")
                    want = want if isinstance(want, tuple) else (want,)
                    got_all.append([first_mismatch(torch, g, w.float()) for g, w in zip(got, want)])
                    if pattern == "argument":  # in place: the argument holds the sum
                        got_all[-1].append(first_mismatch(torch, t_arg.float(), sum(x.float() for x in xs)))
                    if pattern == "module_buffer":
                        got_all[-1].append(first_mismatch(torch, mod.buf.float(), sum(x.float() for x in xs)))
                out[key] = got_all
                after = cpp_counts()
                out[f"{key}/cpp"] = (after[0] - before[0], after[1] - before[1])
            except Exception as exc:  # noqa: BLE001 - reported per pattern
                out[key] = f"{type(exc).__name__}: {exc}"[:2000]
            dist.barrier()
    from torch._dynamo.utils import counters

    out["cudagraph_skips"] = int(counters["inductor"].get("cudagraph_skips", 0))
    # The operators' C++ kernels (Note [Operators in C++]): the compiled
    # steps' repeated calls are answered from their table.
    out["cpp_ops"] = st.cpp_ops_info()

    # Eager staging.
    ctx.stage("eager staging")
    eager = {}
    xs = inp(5)
    x = xs[me].clone()
    st.all_reduce(x)
    eager["in_place"] = first_mismatch(torch, x, sum(v.float() for v in xs).to(torch.bfloat16))
    m = torch.stack([xs[me][:64]] * 4).t()
    st.all_reduce(m)
    eager["non_contiguous"] = first_mismatch(torch, m, torch.stack([sum(v.float() for v in xs)[:64]] * 4).t()
                                             .to(torch.bfloat16))
    g = st.group_for(None, ctx.dev)
    # Small calls take the tensor where it lies (Note [Inputs outside the
    # block] in core/symm/coll): no copy, so the workspace keeps what it
    # held, eager and in a replayed CUDA graph.
    ws = st._workspaces[id(g)]
    ws.tensor.fill_(0x5A)
    xs = inp(6)
    total = sum(v.float() for v in xs).to(torch.bfloat16)
    y = xs[me].clone()
    st.all_reduce(y)
    ag = st.all_gather(xs[me][:256] * 1)
    rs = st.reduce_scatter(xs[me] * 1)
    torch.cuda.synchronize(dev)
    eager["direct"] = first_mismatch(torch, y, total)
    eager["direct_all_gather"] = first_mismatch(torch, ag, torch.cat([v[:256] for v in xs]))
    eager["direct_reduce_scatter"] = first_mismatch(torch, rs, total[me * (n // W):(me + 1) * (n // W)])
    eager["direct_untouched"] = bool((ws.tensor == 0x5A).all().item())
    z = torch.zeros(n, dtype=torch.bfloat16, device=dev)
    cs = torch.cuda.Stream(device=dev)
    cs.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(cs):
        st.all_reduce(z)
        torch.cuda.synchronize(dev)
        zg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(zg, stream=cs):
            st.all_reduce(z)
    xs = inp(7)
    z.copy_(xs[me])
    torch.cuda.synchronize(dev)
    dist.barrier()
    zg.replay()
    ctx.wait_gpu("direct replay")
    eager["direct_replay"] = first_mismatch(torch, z, sum(v.float() for v in xs).to(torch.bfloat16))
    eager["direct_untouched_replay"] = bool((ws.tensor == 0x5A).all().item())
    dist.barrier()
    big_n = (st._workspaces[id(g)].nbytes // 2) * 4
    big = torch.ones(big_n, dtype=torch.bfloat16, device=dev)
    # Inside capture, a call that needs a bigger workspace raises and says what to do.
    s = torch.cuda.Stream(device=dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(s):
            with torch.cuda.graph(graph, stream=s):
                st.all_reduce(big)
        eager["capture_growth"] = None
    except RuntimeError as exc:
        eager["capture_growth"] = str(exc)
    torch.cuda.synchronize(dev)
    dist.barrier()
    st.all_reduce(big)  # outside capture it grows
    ctx.wait_gpu("grown")
    eager["grown"] = first_mismatch(torch, big, torch.full_like(big, W))
    eager["grown_bytes"] = st._workspaces[id(g)].nbytes
    # And the grown workspace is captured and replayed.
    big.fill_(1)
    with torch.cuda.stream(s):
        st.all_reduce(big)
        torch.cuda.synchronize(dev)
        big.fill_(1)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            st.all_reduce(big)
    big.fill_(2)
    torch.cuda.synchronize(dev)
    dist.barrier()
    graph.replay()
    ctx.wait_gpu("staged replay")
    eager["staged_replay"] = first_mismatch(torch, big, torch.full_like(big, 2 * W))
    out["eager"] = eager
    dist.barrier()
    return out


if __name__ == "__main__":
    run(body)
