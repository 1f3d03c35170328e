"""A compiled training step: write a 4 KiB bf16 input into a symmetric
buffer, all-reduce it, multiply, add, on --world GPUs (2; 1 times the
host path and the kernels with no peer), with libsymmem
(symmem.torch) beside torch's one_shot_all_reduce in the same run:
uncompiled, torch.compile default mode, and mode="reduce-overhead" (CUDA
graphs), each with fullgraph=True (a graph break fails the run).

    python3 bench/compile_bench.py [--world 2] [--calls 200] [--kib 4]

libsymmem's step is a module that keeps a buffer of symmem.torch.empty,
copies the input into it and all-reduces it in place (the module-buffer
pattern), and the functional form on a plain intermediate
(symmem.torch.all_reduce(x * 1, inplace=False)); torch's step copies into a
symm_mem.empty buffer and calls torch.ops.symm_mem.one_shot_all_reduce
uncompiled, and passes it an intermediate compiled (which Inductor places
in symmetric memory); "torch one_shot, module buffer" is torch's step as a
module that writes its buffer (what a compiled module and its written
buffer cost, beside the module-buffer pattern). A step the installed torch cannot run is reported
with its reason; torch's default-mode step is the reference (its eager step
where that fails).
Each row: the slowest rank's wall time per call over --calls calls in a
Python loop ending with a synchronize, ranks lined up before each of REPS
repetitions, median; every row checked against the eager result. The run
prints, per mode, the cudagraph skips Inductor counted (a "skipping
cudagraphs" reason shows here) and GOAL lines: compiled default at most
1.0x torch's default step, reduce-overhead captured (no skip) and at most
0.5x torch's default step. NVLink multicast stays off.
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


def rank_main(rank, world, port, calls, kib):
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    import symmem.torch as st

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=dev)
    gname = dist.group.WORLD.group_name
    try:
        symm_mem.enable_symm_mem_for_group(gname)
    except Exception:
        pass
    n = (kib << 10) // 2
    x = (torch.arange(n, device=dev) % 7 + rank).to(torch.bfloat16)

    class SymmemStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("buf", st.empty(n, dtype=torch.bfloat16, device=dev))

        def forward(self, x):
            self.buf.copy_(x)
            st.all_reduce(self.buf)
            return self.buf * 2 + 1

    def symmem_functional(x):
        return st.all_reduce(x * 1, inplace=False) * 2 + 1

    tbuf = symm_mem.empty(n, dtype=torch.bfloat16, device=dev)
    symm_mem.rendezvous(tbuf, gname)

    # torch's step: uncompiled, the input is copied into a symm_mem.empty
    # buffer; compiled, a copy_ into that buffer would hand the operator
    # functionalization's copy (torch refuses it as not allocated by
    # empty_strided_p2p), so the compiled step passes an intermediate and
    # leaves Inductor to place it in symmetric memory (its lowering of the
    # symm_mem operators does that for a buffer it allocates).
    def torch_step_eager(x):
        tbuf.copy_(x)
        return torch.ops.symm_mem.one_shot_all_reduce(tbuf, "sum", gname) * 2 + 1

    def torch_step_compiled(x):
        return torch.ops.symm_mem.one_shot_all_reduce(x * 1, "sum", gname) * 2 + 1

    # torch's step as a module that writes its buffer (torch's symmetric
    # tbuf) and all-reduces it, an intermediate of it when compiled: what a
    # compiled module and its written buffer cost torch, beside the
    # module-buffer pattern.
    class TorchModuleStep(torch.nn.Module):
        def __init__(self, compiled: bool):
            super().__init__()
            self.register_buffer("buf", tbuf)
            self.compiled = compiled

        def forward(self, x):
            self.buf.copy_(x)
            a = self.buf * 1 if self.compiled else self.buf
            return torch.ops.symm_mem.one_shot_all_reduce(a, "sum", gname) * 2 + 1

    want = None
    steps = {}
    sym_mod = SymmemStep()
    for mode in ("eager", "default", "reduce-overhead"):
        torch_step = torch_step_eager if mode == "eager" else torch_step_compiled
        torch_mod = TorchModuleStep(mode != "eager")
        for name, fn in (("libsymmem module buffer", sym_mod), ("libsymmem functional", symmem_functional),
                         ("torch one_shot_all_reduce", torch_step), ("torch one_shot, module buffer", torch_mod)):
            steps[(name, mode)] = fn if mode == "eager" else torch.compile(fn, fullgraph=True, mode=mode)
    from torch._dynamo.utils import counters

    results, wrong, skips, failed = {}, {}, {}, {}
    for (name, mode), fn in steps.items():
        before = dict(counters["inductor"])
        try:
            for _ in range(5):  # compile, warm up, record the CUDA graph
                got = fn(x).clone()
            torch.cuda.synchronize()
        except Exception as exc:  # a step the installed torch cannot run: say why, go on
            failed[(name, mode)] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            dist.barrier()
            continue
        if want is None:
            want = got
        wrong[(name, mode)] = not torch.equal(got, want)
        skips[(name, mode)] = {k: v - before.get(k, 0) for k, v in counters["inductor"].items()
                               if "skip" in k and v - before.get(k, 0)}
        ts = []
        for _ in range(REPS):
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(x)
            torch.cuda.synchronize()
            t = torch.tensor([(time.perf_counter() - t0) / calls * 1e6], device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            ts.append(float(t.item()))
        results[(name, mode)] = statistics.median(ts)
    if rank == 0:
        for (name, mode), why in failed.items():
            print(f"step {mode:16s} {name:28s} cannot run: {why}", flush=True)
        for (name, mode), us in results.items():
            print(f"step {mode:16s} {name:28s} {us:9.2f} us per call   same as eager: "
                  f"{'no' if wrong[(name, mode)] else 'yes'}   cudagraph skips: {skips[(name, mode)] or 'none'}",
                  flush=True)
        ref = results.get(("torch one_shot_all_reduce", "default")) or results.get(("torch one_shot_all_reduce", "eager"))
        for name in ("libsymmem module buffer", "libsymmem functional"):
            if (name, "default") not in results or (name, "reduce-overhead") not in results or not ref:
                print(f"GOAL {name}: not measured (a step failed above)", flush=True)
                continue
            d, ro = results[(name, "default")], results[(name, "reduce-overhead")]
            print(f"GOAL default          {name:28s} {d:9.2f} us  torch default {ref:9.2f} us  {d / ref:.3f}x  "
                  f"{'OK' if d <= ref else 'MISSED'} (goal <= 1.0x)", flush=True)
            mref = results.get(("torch one_shot, module buffer", "default"))
            if name == "libsymmem module buffer" and mref:
                print(f"  beside torch's step as a module that writes its buffer: {mref:9.2f} us  {d / mref:.3f}x",
                      flush=True)
            captured = not skips[(name, "reduce-overhead")]
            print(f"GOAL reduce-overhead  {name:28s} {ro:9.2f} us  torch default {ref:9.2f} us  {ro / ref:.3f}x  "
                  f"captured: {'yes' if captured else 'no'}  "
                  f"{'OK' if captured and ro <= 0.5 * ref else 'MISSED'} (goal <= 0.5x, captured)", flush=True)
    bad = any(wrong.values()) or any(k[0].startswith("libsymmem") for k in failed)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--kib", type=int, default=4)
    ap.add_argument("--child", nargs=3)
    a = ap.parse_args()
    if a.child:
        return rank_main(int(a.child[0]), int(a.child[1]), int(a.child[2]), a.calls, a.kib)
    port = 29600 + os.getpid() % 1000
    env = dict(os.environ, SYMMEM_BACKEND="cuda")
    procs = [subprocess.Popen([sys.executable, __file__, "--calls", str(a.calls), "--kib", str(a.kib),
                               "--child", str(r), str(a.world), str(port)], env=env) for r in range(a.world)]
    return max(p.wait(timeout=1200) for p in procs)


if __name__ == "__main__":
    sys.exit(main())
