"""NCCL all_reduce on four kinds of tensors, and rendezvous over an NCCL
group against the socket group, in one run on the same GPUs.

    python3 bench/nccl_bench.py --out DIR [--gpus 2] [--reps 3]

One rank per GPU (default 2), bf16, 4 KiB to 256 MiB, torch.distributed
over NCCL (init_process_group(..., device_id=)):

    plain        tensors from torch's caching allocator
    symmem       libsymmem tensors (symmem.torch.empty), no window
    symmem+win   libsymmem tensors after symmem.torch.rendezvous over the NCCL
                 process group: the segment is an NCCL symmetric window
    torch-nccl   torch's own NCCL symmetric memory
                 (symm_mem.set_backend("NCCL"), symm_mem.empty + rendezvous)

Time per all_reduce is the median over --reps loops of CUDA-event time on
rank 0 (every rank runs the same loop; ranks line up on a barrier first).
NCCL runs with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING,REG into a file
per rank; the lines NCCL logged for the first call of each (kind, size) on
rank 0 (the algorithm and protocol it chose, symmetric-kernel notes) go to
DIR/nccl_bench_algos.txt. Results: DIR/nccl_bench.md and .json. NVLink
multicast stays off (NCCL_NVLS_ENABLE=0).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
KINDS = ["plain", "symmem", "symmem+win", "torch-nccl"]
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def human(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def ms(t0):
    return (time.perf_counter() - t0) * 1e3


def rank_main(rank, world, port, logdir, out, reps):
    import torch
    import torch.distributed as dist

    import symmem
    import symmem.torch as st

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=dev)
    log = os.path.join(logdir, f"nccl.{rank}.log")  # NCCL_DEBUG_FILE (set by the parent)
    res = {"rendezvous": {}, "allreduce": {}, "algos": {}, "errors": {}}

    # --- rendezvous: socket group vs NCCL group (with and without windows)
    def rendezvous_times(make_group, label):
        dist.barrier()
        t0 = time.perf_counter()
        g = make_group()
        create = ms(t0)
        t = st.empty(64 << 20, dtype=torch.uint8, device=rank)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        h = st.rendezvous(t, g)
        cold = ms(t0)
        warm = []
        for _ in range(20):
            dist.barrier()
            t0 = time.perf_counter()
            h2 = st.rendezvous(t, g)
            warm.append(ms(t0))
            h2.release()
        res["rendezvous"][label] = {"create_ms": create, "cold_ms": cold, "warm_ms": statistics.median(warm)}
        h.release()
        del t
        return g

    name = f"nb{port}"
    pg = dist.group.WORLD
    comm = st._nccl_comm_ptr(torch, pg, st._nccl_backend(torch, pg), rank)
    groups = [
        rendezvous_times(lambda: symmem.Group(f"{name}-sock", rank, world, device=rank, timeout=120), "socket group"),
        rendezvous_times(lambda: symmem.Group.from_nccl(comm, f"{name}-nccl", timeout=120), "NCCL group, windows"),
        rendezvous_times(lambda: symmem.Group.from_nccl(comm, f"{name}-nw", timeout=120, windows=False), "NCCL group, no windows"),
    ]

    # --- the four kinds of buffers, one of 256 MiB each
    numel = SIZES[-1] // 2
    bufs = {"plain": torch.empty(numel, dtype=torch.bfloat16, device=dev),
            "symmem": st.empty(numel, dtype=torch.bfloat16, device=rank)}
    win = st.empty(numel, dtype=torch.bfloat16, device=rank)
    hwin = st.rendezvous(win, pg)  # the NCCL process group: window registered
    res["window"] = hwin.nccl_window is not None
    bufs["symmem+win"] = win
    try:
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.set_backend("NCCL")
        tn = symm_mem.empty(numel, dtype=torch.bfloat16, device=dev)
        symm_mem.rendezvous(tn, pg.group_name)
        bufs["torch-nccl"] = tn
    except Exception as exc:  # reported in the table
        res["errors"]["torch-nccl"] = f"{type(exc).__name__}: {exc}"

    stream = torch.cuda.current_stream()
    for kind in KINDS:
        if kind not in bufs:
            continue
        buf = bufs[kind]
        buf.fill_(1.0)
        for size in SIZES:
            x = buf[: size // 2]
            dist.barrier()
            torch.cuda.synchronize()
            at = os.path.getsize(log) if os.path.exists(log) else 0
            dist.all_reduce(x)  # first call: NCCL logs its choice
            torch.cuda.synchronize()
            if rank == 0 and os.path.exists(log):
                with open(log, errors="replace") as f:
                    f.seek(at)
                    lines = [l.rstrip() for l in f if any(w in l.lower() for w in ("algo", "sym", "proto", "regist", "window"))]
                res["algos"][f"{kind} {human(size)}"] = lines[:6]
            iters = 50 if size <= (1 << 20) else (20 if size <= (16 << 20) else 5)
            for _ in range(5):
                dist.all_reduce(x)
            times = []
            for _ in range(reps):
                dist.barrier()
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record(stream)
                for _ in range(iters):
                    dist.all_reduce(x)
                e1.record(stream)
                e1.synchronize()
                times.append(e0.elapsed_time(e1) / iters * 1e3)  # µs
            res["allreduce"][f"{kind} {size}"] = statistics.median(times)
    torch.cuda.synchronize()
    dist.barrier()
    hwin.release()
    for g in groups:
        g.destroy()
    with open(out, "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    ap.add_argument("--child", nargs="*")
    a = ap.parse_args()
    if a.child:
        rank_main(int(a.child[0]), int(a.child[1]), int(a.child[2]), a.child[3], a.child[4], a.reps)
        return
    import torch

    n = torch.cuda.device_count()
    if n < 2:
        raise SystemExit("nccl_bench needs two or more GPUs")
    world = min(a.gpus, n)
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    port = 29700 + os.getpid() % 200
    env = dict(os.environ, **NO_MULTICAST, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,TUNING,REG", SYMMEM_BACKEND="cuda")
    procs, outs = [], []
    for rank in range(world):
        o = os.path.join(tmp, f"rank{rank}.json")
        outs.append(o)
        e = dict(env, NCCL_DEBUG_FILE=os.path.join(tmp, f"nccl.{rank}.log"))
        procs.append(subprocess.Popen([sys.executable, __file__, "--reps", str(a.reps), "--child", str(rank), str(world), str(port), tmp, o], env=e))
    for p in procs:
        if p.wait(timeout=1200) != 0:
            raise SystemExit(f"a rank failed with {p.returncode} (logs in {tmp})")
    rs = [json.load(open(o)) for o in outs]
    r0 = rs[0]
    dev = torch.cuda.get_device_name(0)
    lines = [f"{world} × {dev}, one rank per GPU, torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}; "
             f"bf16 all_reduce (sum), µs per call (CUDA events, rank 0, median of {a.reps} loops); NCCL_NVLS_ENABLE=0", "",
             "| size | " + " | ".join(KINDS) + " | symmem+win / plain | symmem+win / torch-nccl |",
             "|---|" + "---|" * (len(KINDS) + 2)]
    for size in SIZES:
        vals = [r0["allreduce"].get(f"{k} {size}") for k in KINDS]
        cells = [f"{v:.1f}" if v is not None else "—" for v in vals]
        p, w, t = vals[0], vals[2], vals[3]
        lines.append(f"| {human(size)} | " + " | ".join(cells) + f" | {w / p:.2f} |" + (f" {w / t:.2f} |" if t else " — |"))
    for k, e in r0["errors"].items():
        lines.append(f"\n{k}: not measured: {e}")
    lines += ["", f"Rendezvous of a 64 MiB libsymmem tensor ({world} ranks, slowest rank):", "",
              "| group | creation (ms) | first rendezvous (ms) | again, same tensor (µs) |", "|---|---|---|---|"]
    for label in r0["rendezvous"]:
        v = {k: max(r["rendezvous"][label][k] for r in rs) for k in r0["rendezvous"][label]}
        lines.append(f"| {label} | {v['create_ms']:.2f} | {v['cold_ms']:.2f} | {v['warm_ms'] * 1e3:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(a.out, "nccl_bench.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "nccl_bench.json"), "w") as f:
        json.dump(rs, f, indent=1)
    with open(os.path.join(a.out, "nccl_bench_algos.txt"), "w") as f:
        for key, ls in r0["algos"].items():
            f.write(f"== {key}\n" + "\n".join(ls) + "\n")
    print(f"NCCL's choices per kind and size: {os.path.join(a.out, 'nccl_bench_algos.txt')}")


if __name__ == "__main__":
    main()
