"""The collectives against references computed with torch (every rank).

usage: coll_check.py MAX_BYTES

Every rank generates every rank's input (seeded by rank and case) on its
GPU, so each can compute the reference with torch ops in the order Note
[Collectives] promises: fp32 accumulation in rank order 0..W-1, rounded once
to the dtype (torch's .to() rounds to nearest even), int32 wrapping. Both
all-reduce algorithms are fixed-order, so every comparison is exact
(torch.equal); a mismatch reports the first wrong element.

Cases: all_reduce (sum, max, min over bfloat16, float16, float32; int32
sum, max) in place (auto, one-shot, two-shot), out of place into a plain
torch tensor (one-shot) and into the rendezvoused block (two-shot, auto);
all_gather into a plain tensor and in place; reduce_scatter into a plain
tensor; sizes of each rank's input from 4 bytes to MAX_BYTES (powers of 4
and odd counts), then symmem.torch's all_reduce / all_gather /
reduce_scatter on tensors from symmem.torch.empty.
"""

from __future__ import annotations

import sys
from functools import partial

from _symm_common import first_mismatch, rank_inputs, reduce_reference, run, typed_view


def body(ctx):
    torch = ctx.torch
    import symmem
    import symmem.torch as st

    max_bytes = int(sys.argv[1])
    W, me = ctx.world, ctx.rank
    dev = ctx.device
    info = symmem.collectives_load(ctx.dev)
    g = ctx.group("coll")
    # The block: input at offset 0, a two-shot output at half.
    half = max(max_bytes * W, 1 << 20)
    buf = st.empty(2 * half, dtype=torch.uint8, device=ctx.dev)
    h = symmem.rendezvous(buf.data_ptr(), g)
    local = torch.empty(half, dtype=torch.uint8, device=dev)
    stream = ctx.cur()
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "int32": torch.int32}

    inputs = partial(rank_inputs, torch, dev, W)
    reduce = partial(reduce_reference, torch)
    view = partial(typed_view, torch)

    sizes = []
    b = 4
    while b <= max_bytes:
        sizes.append(b)
        b *= 4
    sizes += [max_bytes, 12, 4 * 1001 + 4, 65536 + 36]
    checked = 0
    failures = []
    case = 0
    for name, dt in dtypes.items():
        es = torch.tensor([], dtype=dt).element_size()
        ops = ["sum", "max"] if dt == torch.int32 else ["sum", "max", "min"]
        for nbytes in sorted(set(sizes)):
            n = max(1, nbytes // es)
            for op in ops:
                case += 1
                xs = inputs(dt, n, case)
                want = reduce(xs, op, dt)
                variants = ["inplace-auto", "inplace-one", "inplace-two", "local-one", "block-two", "block-auto", "local-auto"]
                if n * es <= (256 << 10):  # the low-latency buffers' default capacity
                    variants += ["inplace-ll", "local-ll"]
                for variant in variants:
                    ctx.stage(f"all_reduce {name} {op} {n} {variant}")
                    view(buf, 0, dt, n).copy_(xs[me])
                    algo = {"auto": None, "one": "one_shot", "two": "two_shot", "ll": "low_latency"}[variant.split("-")[1]]
                    if variant.startswith("inplace"):
                        out, got = None, view(buf, 0, dt, n)
                    elif variant.startswith("local"):
                        out = local.data_ptr()
                        got = view(local, 0, dt, n)
                    else:
                        out = buf.data_ptr() + half
                        got = view(buf, half, dt, n)
                    h.all_reduce(name, op, n, out, stream, algo=algo)
                    ctx.wait_gpu(f"all_reduce {name} {op} {n} {variant}")
                    bad = first_mismatch(torch, got, want)
                    checked += 1
                    if bad:
                        failures.append({"what": f"all_reduce {name} {op} n={n} {variant}", **bad})
                if n % W:
                    continue
                # auto (the low-latency path where it fits), then the barrier kernel
                for algo in ("auto", "one_shot"):
                    ctx.stage(f"reduce_scatter {name} {op} {n} {algo}")
                    view(buf, 0, dt, n).copy_(xs[me])
                    h.reduce_scatter(name, op, n, local.data_ptr(), stream, algo=algo)
                    ctx.wait_gpu("reduce_scatter")
                    per = n // W
                    bad = first_mismatch(torch, view(local, 0, dt, per), want[me * per : (me + 1) * per])
                    checked += 1
                    if bad:
                        failures.append({"what": f"reduce_scatter {name} {op} n={n} {algo}", **bad})
            case += 1
            xs = inputs(dt, n, case)
            want = torch.cat(xs)
            for algo in ("auto", "one_shot"):
                ctx.stage(f"all_gather {name} {n} {algo}")
                view(buf, 0, dt, n).copy_(xs[me])
                h.all_gather(name, n, local.data_ptr(), stream, algo=algo)
                ctx.wait_gpu("all_gather")
                bad = first_mismatch(torch, view(local, 0, dt, W * n), want)
                checked += 1
                if bad:
                    failures.append({"what": f"all_gather {name} n={n} {algo}", **bad})
            if (n * es) % 16 == 0 and W * n * es <= half:
                # in place: our input is chunk `me` of out (out at buf + half - me*n)
                base = half - me * n * es
                view(buf, half, dt, n).copy_(xs[me])
                h2 = symmem.rendezvous(buf.data_ptr() + half, g)
                h2.all_gather(name, n, buf.data_ptr() + base, stream)
                ctx.wait_gpu("all_gather in place")
                bad = first_mismatch(torch, view(buf, base, dt, W * n), want)
                h2.release()
                checked += 1
                if bad:
                    failures.append({"what": f"all_gather in place {name} n={n}", **bad})
    # symmem.torch on tensors from symmem.torch.empty
    ctx.stage("symmem.torch collectives")
    dist = ctx.init_dist()
    t = st.empty(W * 1000, dtype=torch.bfloat16, device=ctx.dev)
    xs = inputs(torch.bfloat16, W * 1000, 99)
    t.copy_(xs[me])
    r = st.all_reduce(t, "sum", dist.group.WORLD)
    torch_checks = {"all_reduce_is_input": r.data_ptr() == t.data_ptr()}
    ctx.wait_gpu("st.all_reduce")
    torch_checks["all_reduce"] = first_mismatch(torch, r, reduce(xs, "sum", torch.bfloat16))
    t.copy_(xs[me])
    gathered = st.all_gather(t, dist.group.WORLD)
    ctx.wait_gpu("st.all_gather")
    torch_checks["all_gather"] = first_mismatch(torch, gathered, torch.cat(xs))
    t.copy_(xs[me])
    scattered = st.reduce_scatter(t, "max", dist.group.WORLD)
    ctx.wait_gpu("st.reduce_scatter")
    torch_checks["reduce_scatter"] = first_mismatch(torch, scattered, reduce(xs, "max", torch.bfloat16)[me * 1000 : (me + 1) * 1000])
    # The same calls as torch operators under torch.compile(fullgraph=True),
    # then that compiled function captured in a CUDA graph and replayed.
    ctx.stage("symmem.torch collectives compiled")

    def step(x):
        st.all_reduce(x)  # in place on the symmetric tensor
        return x * 2 + 1

    y_in = st.empty(W * 1000, dtype=torch.float32, device=ctx.dev)
    y_in.copy_(xs[me].float())
    compiled = torch.compile(step, fullgraph=True)
    got = compiled(y_in)
    want_c = reduce([x.float() for x in xs], "sum", torch.float32) * 2 + 1
    ctx.wait_gpu("compiled all_reduce")
    torch_checks["compiled_all_reduce"] = first_mismatch(torch, got, want_c)
    gs = torch.cuda.Stream(device=dev)
    gs.wait_stream(torch.cuda.current_stream(dev))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(gs):
        y_in.copy_(xs[me].float())
        compiled(y_in)  # warm on the capture stream
        torch.cuda.synchronize(dev)
        with torch.cuda.graph(graph, stream=gs):
            static_out = compiled(y_in)
    y_in.copy_(xs[me].float())
    graph.replay()
    ctx.wait_gpu("compiled all_reduce in a CUDA graph")
    torch_checks["compiled_all_reduce_graph"] = first_mismatch(torch, static_out, want_c)
    ctx.wait_gpu("the end")
    device_error = h.device_error()
    h.release()
    return {"checked": checked, "failures": failures[:10], "torch": torch_checks, "device_error": device_error, "kernels": info}


if __name__ == "__main__":
    run(body)
