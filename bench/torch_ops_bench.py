"""The collectives' operators in compiled code: each through its C++ kernel
(python/symmem/_torch_ops.cpp) and through its Python kernel
(torch.ops.symmem._py_<name>, the one the C++ kernel falls back to) in the
same process, with torch's one_shot_all_reduce and a step without a
collective beside them.

    python3 bench/torch_ops_bench.py [--world 2] [--calls 2000]

Needs the C++ kernels built for the installed torch (`python -m symmem
build-torch-ops`). Each step is torch.compile(fullgraph=True), default
mode, of "collective on a libsymmem tensor of 8 x 256 bf16, then * 2 + 1",
and an all-reduce staged through the workspace (a tensor of torch's
memory, 512 x 1024 bf16);
the rows run interleaved, REPS times, each the slowest rank's wall time
per call over --calls calls in a Python loop ending with a synchronize;
the median is printed with the range. Before timing, every operator's C++
result is compared bit for bit with its Python kernel's, the staged
all-reduce also in a CUDA graph and with two_shot. --world 1 runs one
process (a group of one rank: the kernels and the host path, no peer).
NVLink multicast stays off.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})

REPS = 7


def rank_main(rank, world, port, calls):
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    import symmem.torch as st

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=dev)
    gname = dist.group.WORLD.group_name
    symm_mem.enable_symm_mem_for_group(gname)
    info = st.cpp_ops_info()
    if not info["loaded"]:
        print(f"rank {rank}: the C++ kernels are not loaded ({info}); run python -m symmem build-torch-ops", flush=True)
        return 2
    # The Python kernels are operators without fakes (only the C++ kernels
    # call them); tracing them here needs these.
    lib = torch.library
    lib.register_fake("symmem::_py_all_reduce", lambda t, op, g, a: torch.empty_like(t))
    lib.register_fake("symmem::_py_all_gather", lambda t, g: t.new_empty((world * t.shape[0],) + tuple(t.shape[1:])))
    lib.register_fake("symmem::_py_reduce_scatter",
                      lambda t, op, g: t.new_empty((t.shape[0] // world,) + tuple(t.shape[1:])))
    lib.register_fake("symmem::_py_all_reduce_rmsnorm", lambda x, r, w, e, o, g, a: None)
    lib.register_fake("symmem::_py_all_to_all_v", lambda i, o, s, so, g: None)
    ops = torch.ops.symmem
    gen = torch.Generator(device=dev).manual_seed(3 + rank)
    x = torch.randn(8, 256, device=dev, generator=gen).to(torch.bfloat16)
    t = st.empty(8, 256, dtype=torch.bfloat16, device=dev)
    t.copy_(x)
    res0 = torch.randn(8, 256, device=dev, generator=gen).to(torch.bfloat16)
    w0 = (torch.rand(256, device=dev, generator=gen) + 0.5).to(torch.bfloat16)

    same = {
        "all_reduce": torch.equal(ops.all_reduce(t, "sum", "", "auto"), ops._py_all_reduce(t, "sum", "", "auto")),
        "all_gather": torch.equal(ops.all_gather(t, ""), ops._py_all_gather(t, "")),
        "reduce_scatter": torch.equal(ops.reduce_scatter(t, "sum", ""), ops._py_reduce_scatter(t, "sum", "")),
    }
    outs = []
    for fn in (ops.all_reduce_rmsnorm, ops._py_all_reduce_rmsnorm, ops.all_reduce_rmsnorm):
        r, o = res0.clone(), torch.empty_like(x)
        fn(t, r, w0, 1e-6, o, "", "auto")
        outs.append((r, o))
    same["all_reduce_rmsnorm"] = all(torch.equal(a[0], outs[1][0]) and torch.equal(a[1], outs[1][1])
                                     for a in (outs[0], outs[2]))
    # The split-driven all-to-alls: 8 rows to each rank (2 per expert).
    splits = torch.full((world,), 8 // world, dtype=torch.int64, device=dev)
    splits2d = torch.full((2 * world,), 8 // world // 2, dtype=torch.int64, device=dev)
    offs2d = torch.stack([splits2d, torch.arange(2 * world, device=dev) * (8 // world // 2)])

    def a2a(fn, splits_arg, *extra):
        o = torch.zeros_like(t)
        so = torch.zeros((2, splits_arg.shape[-1]), dtype=torch.int64, device=dev)
        fn(t, o, splits_arg, so, "", *extra)
        return o, so

    for name, cpp, py, sp, extra in (("all_to_all_v", ops.all_to_all_v, ops._py_all_to_all_v, splits, ()),
                                     ("all_to_all_v_2d", ops.all_to_all_v_2d, ops._py_all_to_all_v_2d, splits2d, (1,)),
                                     ("all_to_all_v_2d_offset", ops.all_to_all_v_2d_offset,
                                      ops._py_all_to_all_v_2d_offset, offs2d, ())):
        want = a2a(py, sp, *extra)
        same[name] = all(torch.equal(g[0], want[0]) and torch.equal(g[1], want[1])
                         for g in (a2a(cpp, sp, *extra), a2a(cpp, sp, *extra)))

    a2a_eq = torch.empty_like(t)
    ops._py_all_to_all_out(t, a2a_eq, "")
    same["all_to_all"] = torch.equal(ops.all_to_all(t, ""), a2a_eq)

    # Staged: 1 MiB of torch's memory per rank (past the low-latency path's
    # buffers at two ranks; a group of one stages everything). The first
    # C++ call passes to Python, which enters it; the next ones, replays of
    # a CUDA graph included, are staged in C++.
    big = torch.randn(512, 1024, device=dev, generator=gen).to(torch.bfloat16)
    want = ops._py_all_reduce(big, "sum", "", "auto")
    got = [ops.all_reduce(big, "sum", "", "auto") for _ in range(2)]
    got.append(ops.all_reduce(big, "sum", "", "two_shot"))
    graph, got_g = torch.cuda.CUDAGraph(), torch.empty_like(big)
    with torch.cuda.graph(graph):
        ops.all_reduce_out(big, got_g, "sum", "", "auto")
    got_g.zero_()
    graph.replay()
    torch.cuda.synchronize()
    same["all_reduce, staged"] = all(torch.equal(g, want) for g in got + [got_g])
    same["all_gather, staged"] = all(torch.equal(ops.all_gather(big, ""), ops._py_all_gather(big, ""))
                                     for _ in range(2))
    same["reduce_scatter, staged"] = all(
        torch.equal(ops.reduce_scatter(big, "sum", ""), ops._py_reduce_scatter(big, "sum", "")) for _ in range(2))

    def a2a_step(fn):
        def step(a):
            o = torch.empty_like(a)
            so = torch.empty((2, world), dtype=torch.int64, device=dev)
            fn(a, o, splits, so, "")
            return o * 2 + 1
        return step

    def norm_step(fn):
        def step(a):
            r, o = res0.clone(), torch.empty_like(a)
            fn(a, r, w0, 1e-6, o, "", "auto")
            return o * 2 + r
        return step

    steps = {
        "all_reduce, C++ kernel": lambda a: ops.all_reduce(a, "sum", "", "auto") * 2 + 1,
        "all_reduce, Python kernel": lambda a: ops._py_all_reduce(a, "sum", "", "auto") * 2 + 1,
        "all_gather, C++ kernel": lambda a: ops.all_gather(a, "") * 2 + 1,
        "all_gather, Python kernel": lambda a: ops._py_all_gather(a, "") * 2 + 1,
        "reduce_scatter, C++ kernel": lambda a: ops.reduce_scatter(a, "sum", "") * 2 + 1,
        "reduce_scatter, Python kernel": lambda a: ops._py_reduce_scatter(a, "sum", "") * 2 + 1,
        "all_reduce_rmsnorm, C++ kernel": norm_step(ops.all_reduce_rmsnorm),
        "all_reduce_rmsnorm, Python kernel": norm_step(ops._py_all_reduce_rmsnorm),
        "all_to_all_v, C++ kernel": a2a_step(ops.all_to_all_v),
        "all_to_all_v, Python kernel": a2a_step(ops._py_all_to_all_v),
        "staged all_reduce 1 MiB, C++ kernel": lambda a: ops.all_reduce(a, "sum", "", "auto") * 2 + 1,
        "staged all_reduce 1 MiB, Python kernel": lambda a: ops._py_all_reduce(a, "sum", "", "auto") * 2 + 1,
        "torch one_shot_all_reduce": lambda a: torch.ops.symm_mem.one_shot_all_reduce(a * 1, "sum", gname) * 2 + 1,
        "no collective": lambda a: (a * 1).relu() * 2 + 1,
    }
    compiled = {k: torch.compile(f, fullgraph=True) for k, f in steps.items()}
    arg = {k: (x if k.startswith("torch") else big if k.startswith("staged") else t) for k in steps}
    for k, c in compiled.items():
        for _ in range(20):
            c(arg[k])
    torch.cuda.synchronize()
    times = {k: [] for k in compiled}
    for _ in range(REPS):
        for k, c in compiled.items():
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                c(arg[k])
            torch.cuda.synchronize()
            v = torch.tensor([(time.perf_counter() - t0) / calls * 1e6], device=dev)
            dist.all_reduce(v, op=dist.ReduceOp.MAX)
            times[k].append(float(v.item()))
    if rank == 0:
        print(f"world {world}, {torch.cuda.get_device_name(dev)}, torch {torch.__version__}", flush=True)
        print(f"C++ kernel == Python kernel, bit for bit: {same}", flush=True)
        for k, v in times.items():
            print(f"step {k:36s} {statistics.median(v):8.2f} us  ({min(v):.2f}-{max(v):.2f})", flush=True)
        for name in ("all_reduce", "all_gather", "reduce_scatter", "all_reduce_rmsnorm", "all_to_all_v",
                     "staged all_reduce 1 MiB"):
            c, p = statistics.median(times[f"{name}, C++ kernel"]), statistics.median(times[f"{name}, Python kernel"])
            print(f"RATIO {name:20s} C++ / Python kernel {c / p:.3f}", flush=True)
        print(f"kernels: {st.cpp_ops_info()}", flush=True)
    ok = all(same.values())
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--child", nargs=3)
    a = ap.parse_args()
    if a.child:
        return rank_main(int(a.child[0]), int(a.child[1]), int(a.child[2]), a.calls)
    port = 29600 + os.getpid() % 1000
    env = dict(os.environ, SYMMEM_BACKEND="cuda")
    procs = [subprocess.Popen([sys.executable, __file__, "--calls", str(a.calls), "--child", str(r), str(a.world),
                               str(port)], env=env) for r in range(a.world)]
    return max(p.wait(timeout=1200) for p in procs)


if __name__ == "__main__":
    sys.exit(main())
