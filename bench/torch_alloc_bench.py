"""Per-call cost of torch.empty + del under five allocators, and a small
transformer's training speed and peak memory, native vs libsymmem.

Run on a GPU machine with torch, after `make` (figures: docs/measurements.md):
    python3 bench/torch_alloc_bench.py --reps 5 --out bench-results
The library is $SYMMEM_LIBRARY, else build/libsymmem.so; the trivial
allocators below are compiled by this script with the C compiler ($CC, else
cc) into build/bench/trivial_alloc.so ($TRIVIAL_ALLOC_SO names another).

Allocators compared, each in a fresh process (the global allocator can only
be chosen before CUDA starts), interleaved rep by rep, medians reported:
  native      PyTorch's own CUDACachingAllocator
  symmem      libsymmem as the global allocator (change_current_allocator),
              with its thread caches (the default)
  symmem_nocache  the same with SYMMEM_THREAD_CACHE=0: every call enters Go
              (every size enters Go)
  symmem_pool libsymmem inside torch.cuda.MemPool (PyTorch caches on top)
  passthrough a pluggable allocator that calls the driver's cuMemAlloc /
              cuMemFree (under cudaMalloc / cudaFree) each time
              (bench/trivial_alloc.c)
  c_cache     the same file's size-keyed free list under one mutex: the
              floor of PyTorch's pluggable path
  go_cache    the same free list in Go (bench/gofloor, libgofloor.so from
              make gpu-artifacts; GOFLOOR_SO): the floor of two C-to-Go
              calls per tensor
  rmm         RMM's rmm_torch_allocator on a pool memory resource (when the
              rmm wheels are importable, see scripts/gpu_suite.sh)
Diagnostic variants of symmem (docs/speed.md, "GOMAXPROCS"):
  symmem_gmp4      the same with GOMAXPROCS=4
  symmem_gmp1      the same with GOMAXPROCS=1: the runtime without the
                   library's raise of GOMAXPROCS to 2 on a one-CPU mask
                   (export/procs.go, Note [At least two Ps]); symmem beside
                   it shows what the raise is worth
  symmem_go_free   the Go runtime started before the main thread is pinned,
                   so its threads are not confined to the benchmark's CPU

Every process's figure is reported, not only the median, with what each
process's main thread suffered while timed: involuntary context switches
and the CPU time the process's other threads used (a Go runtime thread or a
driver thread on the benchmark's CPU shows there).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = (4096, 1 << 20, 64 << 20)
MODES = ["native", "symmem", "symmem_nocache", "symmem_pool", "passthrough", "c_cache"]
# A minimal Go c-shared free list (bench/gofloor) shows what the C->Go calls
# alone cost under PyTorch; measured when GOFLOOR_SO names it.
if os.environ.get("GOFLOOR_SO") and os.path.exists(os.environ["GOFLOOR_SO"]):
    MODES.append("go_cache")
DIAG_MODES = ["symmem_gmp4", "symmem_gmp1", "symmem_go_free"]


def rmm_available():
    r = subprocess.run([sys.executable, "-c", "import rmm.allocators.torch"], capture_output=True, text=True)
    return r.returncode == 0


def lib_path():
    return os.environ.get("SYMMEM_LIBRARY", os.path.join(ROOT, "build", "libsymmem.so"))


def require_library():
    """Stops with what to do when the library is not built."""
    if not os.path.exists(lib_path()):
        sys.exit(f"torch_alloc_bench: {lib_path()} does not exist: run `make` at {ROOT} (Go and a C compiler), "
                 "or on a machine without Go carry build/ from `make gpu-artifacts`, or set SYMMEM_LIBRARY")


def trivial_alloc_so():
    """$TRIVIAL_ALLOC_SO, else build/bench/trivial_alloc.so, compiled from
    bench/trivial_alloc.c when missing or older than its source."""
    if os.environ.get("TRIVIAL_ALLOC_SO"):
        return os.environ["TRIVIAL_ALLOC_SO"]
    src = os.path.join(ROOT, "bench", "trivial_alloc.c")
    so = os.path.join(ROOT, "build", "bench", "trivial_alloc.so")
    if not os.path.exists(so) or os.path.getmtime(so) < os.path.getmtime(src):
        os.makedirs(os.path.dirname(so), exist_ok=True)
        cmd = os.environ.get("CC", "cc").split() + ["-O2", "-shared", "-fPIC", "-o", so, src, "-ldl", "-lpthread"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"torch_alloc_bench: building {so} failed: {' '.join(cmd)}\n{r.stderr}")
    return so


def setup(mode):
    """Installs the allocator of mode; returns a context manager for the loop."""
    import contextlib
    import torch
    if mode == "native":
        return contextlib.nullcontext()
    if mode in ("passthrough", "c_cache", "go_cache"):
        # The trivial pluggable allocators (bench/trivial_alloc.c): the
        # driver's allocation each time, and a size-keyed free list under one
        # mutex (the floor of PyTorch's pluggable path).
        so = os.environ.get("TRIVIAL_ALLOC_SO") or trivial_alloc_so()
        fns = {"passthrough": ("raw_alloc", "raw_free"), "c_cache": ("cache_alloc", "cache_free")}.get(mode)
        if mode == "go_cache":
            so, fns = os.environ["GOFLOOR_SO"], ("floor_alloc", "floor_free")
        alloc = torch.cuda.memory.CUDAPluggableAllocator(so, *fns)
        torch.cuda.memory.change_current_allocator(alloc)
        return contextlib.nullcontext()
    if mode == "rmm":
        import rmm
        from rmm.allocators.torch import rmm_torch_allocator
        rmm.mr.set_current_device_resource(rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 30))
        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
        return contextlib.nullcontext()
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import symmem.torch as st
    if mode in ("symmem", "symmem_nocache", "symmem_gmp4", "symmem_gmp1", "symmem_go_free"):
        st.use_as_global_allocator()
        return contextlib.nullcontext()
    pool = st.mem_pool()
    setup.pool = pool  # keep it alive
    return torch.cuda.use_mem_pool(pool)


def loop(size, n):
    import torch
    for _ in range(n):
        t = torch.empty(size, dtype=torch.uint8, device="cuda")
        del t


def bench_cpus(threads):
    """The CPUs a child runs on: the same ones for every allocator, so that a
    comparison does not depend on where the scheduler put each process (runs
    spread over the cores of a large host differed by up to ±50%)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= threads + 2:
        cpus = cpus[2:2 + threads]  # leave the first cores to the system
    return cpus[:max(threads, 1)]


def other_threads_cpu_s():
    """CPU seconds used so far by every thread of this process but the
    calling one (utime+stime from /proc/self/task/*/stat)."""
    me, total = threading.get_native_id(), 0
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass
    return total


def alloc_child(mode, threads):
    if mode == "symmem_go_free":
        # Start the Go runtime first: its threads keep the whole CPU set.
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import symmem
        symmem.version()  # loads the library: the Go runtime starts here
    if os.environ.get("BENCH_CPUS"):
        os.sched_setaffinity(0, {int(c) for c in os.environ["BENCH_CPUS"].split(",")})
    import resource
    import torch
    ctx = setup(mode)
    torch.cuda.init()
    out = {}
    with ctx:
        for size in SIZES:
            loop(size, 200)  # warm the cache
        torch.cuda.synchronize()
        ru0, other0 = resource.getrusage(resource.RUSAGE_THREAD), other_threads_cpu_s()
        # Rounds over the sizes; the median round per size is reported.
        for _ in range(ALLOC_ROUNDS):
            for size, us in alloc_round(mode, threads).items():
                out.setdefault(str(size), []).append(us)
        ru1, other1 = resource.getrusage(resource.RUSAGE_THREAD), other_threads_cpu_s()
    out = {k: statistics.median(v) for k, v in out.items()}
    diag = {"nivcsw": ru1.ru_nivcsw - ru0.ru_nivcsw, "nvcsw": ru1.ru_nvcsw - ru0.ru_nvcsw,
            "other_threads_ms": (other1 - other0) * 1e3, "threads": len(os.listdir("/proc/self/task")),
            "cpus": sorted(os.sched_getaffinity(0))}
    print(json.dumps({"mode": mode, "threads": threads, "us": out, "diag": diag}), flush=True)


ALLOC_ROUNDS = 3


def alloc_round(mode, threads):
    """One timed loop per size: µs per torch.empty+del."""
    import torch
    out = {}
    for size in SIZES:
        n = 20000 if size < (64 << 20) else 4000
        if mode == "passthrough":
            n = min(n, 1500)
        if threads == 1:
            t0 = time.perf_counter()
            loop(size, n)
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / n * 1e6
        else:
            # Each thread runs n/threads calls; per-call time as seen by one
            # thread (wall time / its calls), as the baselines measure it.
            per = max(n // threads, 100)
            barrier = threading.Barrier(threads + 1)

            def work():
                barrier.wait()
                loop(size, per)

            ts = [threading.Thread(target=work) for _ in range(threads)]
            for t in ts:
                t.start()
            barrier.wait()
            t0 = time.perf_counter()
            for t in ts:
                t.join()
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / per * 1e6
        out[size] = us
    return out


def train_child(mode, steps):
    import torch
    import torch.nn as nn
    ctx = setup(mode)
    torch.manual_seed(0)
    with ctx:
        model = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True),
            num_layers=6).cuda()
        head = nn.Linear(512, 1000).cuda()
        opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-4)
        x = torch.randn(32, 256, 512, device="cuda")
        y = torch.randint(0, 1000, (32, 256), device="cuda")

        def step():
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(head(model(x)).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            return loss

        for _ in range(10):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        sps = steps / (time.perf_counter() - t0)
    if mode == "native":
        peak = torch.cuda.max_memory_reserved()
    else:
        import symmem
        peak = symmem.memory_stats(0)["reserved_bytes.all.peak"]
    print(json.dumps({"mode": mode, "steps_per_s": sps, "peak_reserved": peak}), flush=True)


def run_child(args, env=None):
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    r = subprocess.run([sys.executable, os.path.abspath(__file__)] + args, capture_output=True, text=True,
                       timeout=600, env=env)
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"child {args} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--train-steps", type=int, default=60)
    ap.add_argument("--train-reps", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--no-diag", action="store_true", help="leave out the diagnostic variants of symmem")
    ap.add_argument("--child", nargs="*")
    a = ap.parse_args()
    if a.child:
        kind, mode, arg = a.child
        (alloc_child if kind == "alloc" else train_child)(mode, int(arg))
        return
    require_library()
    os.environ["TRIVIAL_ALLOC_SO"] = trivial_alloc_so()  # built once, here; the children inherit it
    if rmm_available():
        MODES.append("rmm")
    else:
        print("rmm not importable: its figures are left out", file=sys.stderr)
    if not a.no_diag:
        MODES.extend(DIAG_MODES)
    import torch
    os.makedirs(a.out, exist_ok=True)
    device = torch.cuda.get_device_name(0)
    results = {}
    diags = {}
    # One discarded run first: the GPU's clocks and the driver warm up during
    # the first child (it measured ~1.7x slower for every allocator alike).
    run_child(["--child", "alloc", "native", "1"])
    for rep in range(a.reps):
        for threads in a.threads:
            for mode in MODES:
                env = {"BENCH_CPUS": ",".join(map(str, bench_cpus(threads)))}
                if mode == "symmem_gmp4":
                    env["GOMAXPROCS"] = "4"
                if mode == "symmem_gmp1":
                    env["GOMAXPROCS"] = "1"
                if mode == "symmem_nocache":
                    env["SYMMEM_THREAD_CACHE"] = "0"
                r = run_child(["--child", "alloc", mode, str(threads)], env)
                for size, us in r["us"].items():
                    results.setdefault((mode, threads, int(size)), []).append(us)
                diags.setdefault((mode, threads), []).append(r["diag"])
        print(f"rep {rep + 1}/{a.reps} done", file=sys.stderr, flush=True)
    train = {}
    for rep in range(a.train_reps):
        for mode in ("native", "symmem"):
            train.setdefault(mode, []).append(run_child(["--child", "train", mode, str(a.train_steps)]))
    med = {k: statistics.median(v) for k, v in results.items()}
    lines = [f"Device: {device}; torch {torch.__version__}; µs per torch.empty+del: medians of {a.reps} interleaved runs "
             f"(each the median of {ALLOC_ROUNDS} rounds), every allocator pinned to the same CPUs "
             f"({', '.join(f'{t} thread(s): {bench_cpus(t)}' for t in a.threads)})", ""]
    lines.append("| allocator | threads | " + " | ".join(f"{s // 1024} KiB" if s < (1 << 20) else f"{s >> 20} MiB" for s in SIZES) + " |")
    lines.append("|---|---|" + "---|" * len(SIZES))
    for threads in a.threads:
        for mode in MODES:
            lines.append(f"| {mode} | {threads} | " + " | ".join(f"{med[(mode, threads, s)]:.2f}" for s in SIZES) + " |")
    lines.append("")
    lines.append("Ratios (1 thread): symmem / native = " + ", ".join(
        f"{med[('symmem', 1, s)] / med[('native', 1, s)]:.2f}" for s in SIZES) +
        "; symmem / c_cache = " + ", ".join(f"{med[('symmem', 1, s)] / med[('c_cache', 1, s)]:.2f}" for s in SIZES) +
        "; passthrough / symmem = " + ", ".join(f"{med[('passthrough', 1, s)] / med[('symmem', 1, s)]:.0f}x" for s in SIZES) +
        ("; rmm / native = " + ", ".join(f"{med[('rmm', 1, s)] / med[('native', 1, s)]:.2f}" for s in SIZES) if "rmm" in MODES else ""))
    lines.append("")
    lines.append(f"Every process's figure (µs per torch.empty+del of 4 KiB, in run order), with what its main thread "
                 "suffered while timed: involuntary context switches / CPU ms used by the process's other threads:")
    lines.append("")
    lines.append("| allocator | threads | each process: µs (invol. switches / other threads' CPU ms) | spread (max/min) |")
    lines.append("|---|---|---|---|")
    for threads in a.threads:
        for mode in MODES:
            vals = results[(mode, threads, SIZES[0])]
            ds = diags[(mode, threads)]
            cells = ", ".join(f"{v:.2f} ({d['nivcsw']} / {d['other_threads_ms']:.0f})" for v, d in zip(vals, ds))
            lines.append(f"| {mode} | {threads} | {cells} | {max(vals) / min(vals):.2f} |")
    lines.append("")
    lines.append(f"Training (TransformerEncoder 6x512, batch 32x256, AdamW, {a.train_steps} steps, medians of {a.train_reps}):")
    lines.append("")
    lines.append("| allocator | steps/s | peak reserved (MiB) |")
    lines.append("|---|---|---|")
    tmed = {}
    for mode, rs in train.items():
        sps = statistics.median(r["steps_per_s"] for r in rs)
        peak = statistics.median(r["peak_reserved"] for r in rs)
        tmed[mode] = (sps, peak)
        lines.append(f"| {mode} | {sps:.2f} | {peak / 2**20:.0f} |")
    lines.append("")
    if len(tmed) == 2:
        lines.append(f"symmem / native: throughput {tmed['symmem'][0] / tmed['native'][0]:.3f}x, "
                     f"peak reserved {tmed['symmem'][1] / tmed['native'][1]:.3f}x")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out, "torch_alloc.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.out, "torch_alloc.json"), "w") as f:
        json.dump({"device": device, "alloc": {f"{m}/{t}/{s}": v for (m, t, s), v in results.items()},
                   "diag": {f"{m}/{t}": v for (m, t), v in diags.items()}, "train": train}, f)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(a.threads), figsize=(5.5 * len(a.threads), 4), sharey=True, squeeze=False)
        axes = axes[0]
        for ax, threads in zip(axes, a.threads):
            width = 0.8 / len(MODES)
            for i, mode in enumerate(MODES):
                xs = [j + (i - (len(MODES) - 1) / 2) * width for j in range(len(SIZES))]
                ax.bar(xs, [med[(mode, threads, s)] for s in SIZES], width, label=mode)
            ax.set_xticks(range(len(SIZES)))
            ax.set_xticklabels(["4 KiB", "1 MiB", "64 MiB"])
            ax.set_yscale("log")
            ax.set_title(f"{threads} thread(s)")
            ax.set_ylabel("µs per torch.empty + del (log)")
        axes[0].legend()
        fig.suptitle(f"Per-call allocation time on {device}")
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "torch_alloc.png"), dpi=110)
    except Exception as e:  # the table is the result; the plot is a view of it
        print(f"plot skipped: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
