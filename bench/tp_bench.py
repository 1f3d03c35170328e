"""Tensor parallelism on 2 GPUs: libsymmem's all_reduce_rmsnorm and fused
matmul operators beside the sequences and operators they replace, in the
same run, at the shapes of a decode step and of a Llama-70B-like layer.

    python3 bench/tp_bench.py --out DIR [--world 2] [--mm-tokens 8192] [--mm-hidden 8192]
        [--mm-inter 28672] [--no-matmul] [--no-eager]

The decode step (bf16; tokens x hidden 1x4096, 8x4096, 32x8192, 128x8192):
  libsymmem fused            symmem.torch.all_reduce_rmsnorm (one kernel on the
                             low-latency path where it fits)
  libsymmem fused, torch x   the same on an input of torch's memory (read where
                             it lies on the low-latency path, else staged)
  libsymmem all_reduce+norm  libsymmem's all_reduce, then + residual and
                             torch.nn.functional.rms_norm
  torch two-shot+norm        torch.ops.symm_mem.two_shot_all_reduce_, + residual, rms_norm
  nccl+norm                  torch.distributed.all_reduce (NCCL), + residual, rms_norm
  norm alone                 + residual, rms_norm (no communication)
  libsymmem all_reduce alone
The matmuls (bf16, a Llama-70B-like layer by default: 8192 tokens, hidden
8192, intermediate 28672 split over the ranks; sequence parallel):
  all-gather then matmul     libsymmem fused_all_gather_matmul, torch's
                             torch.ops.symm_mem.fused_all_gather_matmul, NCCL
                             all_gather_into_tensor + matmul, the matmul alone
                             (the gathered A times this rank's B: the floor)
  matmul then reduce-scatter libsymmem fused_matmul_reduce_scatter, torch's,
                             matmul + NCCL reduce_scatter_tensor, the matmul alone

Timing: graph rows capture ITERS calls (the matmuls MM_ITERS) in a CUDA
graph, replayed REPS times between CUDA events with the ranks lined up
before each replay, every implementation round-robin; each replay's figure
is the slowest rank's, the row the median, per call. Eager rows:
EAGER_CALLS uncaptured calls in a Python loop between CUDA events, the
slowest rank, median of EAGER_REPS. GOAL lines: the fused norm at most 5 us
at 1x4096 and at most 0.5x torch two-shot+norm at every shape (graph); the
fused matmuls at most 0.95x torch's and at most 1.1x the matmul alone
(graph); EAGER lines: every libsymmem operator at most 1.0x torch's
corresponding eager sequence. Writes DIR/tp_bench.json. NVLink multicast is
off for everyone (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1, in this process and its children). The defaults
finish in about 2 minutes on 2 x H200.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
from bench_common import NO_MULTICAST  # noqa: E402 - multicast off for every process

ITERS = 20
MM_ITERS = 3
REPS = 15
EAGER_CALLS = 50
MM_EAGER_CALLS = 5
EAGER_REPS = 7
NORM_SHAPES = [(1, 4096), (8, 4096), (32, 8192), (128, 8192)]
EPS = 1e-5


def rank_main(rank, world, port, out_path, mm, eager):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import symmem
    import symmem.torch as st

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=dev)
    gname = dist.group.WORLD.group_name
    try:
        import torch.distributed._symmetric_memory as symm_mem

        try:
            symm_mem.enable_symm_mem_for_group(gname)  # needed before torch 2.9, a no-op after
        except Exception:  # noqa: BLE001
            pass
    except Exception:  # noqa: BLE001
        symm_mem = None
    symmem.collectives_load(rank)
    stream = torch.cuda.Stream(device=dev)
    slowest = torch.zeros(1, dtype=torch.float64, device=dev)

    def worst(us):
        slowest.fill_(us)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return float(slowest.item())

    from graph_timing import graph_timer  # bench/, beside this file

    def capture(fn, iters):
        return graph_timer(torch, dist, stream, iters)[0](fn)

    def replay_us(graph, iters):
        return worst(graph_timer(torch, dist, stream, iters)[1](graph))

    def eager_us(fn, calls):
        for _ in range(3):
            fn()
        dist.barrier()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        return worst(a.elapsed_time(b) * 1e3 / calls)

    def measure(section, shape, impls, iters, calls, rows):
        graphs, times = {}, {}
        for name, fn in impls.items():
            try:
                graphs[name] = capture(fn, iters)
                times[name] = []
            except Exception as exc:  # noqa: BLE001 - reported; the others still run
                if rank == 0:
                    print(f"{section} {shape} {name}: capture failed: {type(exc).__name__}: {exc}", flush=True)
        for _ in range(REPS):
            for name, graph in graphs.items():
                times[name].append(replay_us(graph, iters))
        del graphs
        for name in impls:
            us = statistics.median(times[name]) if name in times else None
            rows.append({"section": section, "shape": shape, "impl": name, "mode": "graph", "us": us})
            if rank == 0 and us is not None:
                print(f"graph {section:7s} {str(shape):22s} {name:28s} {us:10.2f} us", flush=True)
        if not eager:
            return
        for name, fn in impls.items():
            try:
                us = statistics.median(eager_us(fn, calls) for _ in range(EAGER_REPS))
            except Exception as exc:  # noqa: BLE001
                us = None
                if rank == 0:
                    print(f"{section} {shape} {name}: eager failed: {type(exc).__name__}: {exc}", flush=True)
            rows.append({"section": section, "shape": shape, "impl": name, "mode": "eager", "us": us})
            if rank == 0 and us is not None:
                print(f"eager {section:7s} {str(shape):22s} {name:28s} {us:10.2f} us", flush=True)

    rows = []
    bf = torch.bfloat16
    for T, H in NORM_SHAPES:
        x = st.empty(T, H, dtype=bf, device=dev).normal_()
        xt = torch.randn(T, H, device=dev).to(bf)  # torch's memory: read where it lies, or staged
        xa = st.empty(T, H, dtype=bf, device=dev).normal_()
        residual = torch.randn(T, H, device=dev).to(bf)
        weight = torch.ones(H, dtype=bf, device=dev)
        out = torch.empty(T, H, dtype=bf, device=dev)
        nin = torch.randn(T, H, device=dev).to(bf)
        impls = {
            "libsymmem fused": lambda: st.all_reduce_rmsnorm(x, residual, weight, EPS, out=out),
            "libsymmem fused, torch x": lambda: st.all_reduce_rmsnorm(xt, residual, weight, EPS, out=out),
            "libsymmem all_reduce+norm": lambda: (st.all_reduce(xa), residual.add_(xa),
                                                  out.copy_(F.rms_norm(residual, (H,), weight, EPS))),
            "nccl+norm": lambda: (dist.all_reduce(nin), residual.add_(nin),
                                  out.copy_(F.rms_norm(residual, (H,), weight, EPS))),
            "norm alone": lambda: (residual.add_(nin), out.copy_(F.rms_norm(residual, (H,), weight, EPS))),
            "libsymmem all_reduce alone": lambda: st.all_reduce(xa),
        }
        if symm_mem is not None:
            tin = symm_mem.empty(T, H, dtype=bf, device=dev).normal_()
            symm_mem.rendezvous(tin, gname)
            impls["torch two-shot+norm"] = lambda: (torch.ops.symm_mem.two_shot_all_reduce_(tin, "sum", gname),
                                                    residual.add_(tin),
                                                    out.copy_(F.rms_norm(residual, (H,), weight, EPS)))
        measure("norm", f"{T}x{H}", impls, ITERS, EAGER_CALLS, rows)

    if mm:
        T, Hd, I = mm
        f = I // world
        g = torch.Generator(device="cpu").manual_seed(5)
        a_shard = (torch.randn(T // world, Hd, generator=g)).to(dev, bf)
        a_full = torch.empty(T, Hd, dtype=bf, device=dev)
        b1 = (torch.randn(Hd, f, generator=g) / Hd ** 0.5).to(dev, bf)
        h_act = torch.randn(T, f, generator=g).to(dev, bf)
        b2 = (torch.randn(f, Hd, generator=g) / f ** 0.5).to(dev, bf)
        rs_out = torch.empty(T // world, Hd, dtype=bf, device=dev)
        mm_out1 = torch.empty(T, f, dtype=bf, device=dev)
        mm_out2 = torch.empty(T, Hd, dtype=bf, device=dev)
        ag = {
            "libsymmem fused": lambda: st.fused_all_gather_matmul(a_shard, [b1], 0, return_a=False),
            "nccl all_gather+matmul": lambda: (dist.all_gather_into_tensor(a_full, a_shard),
                                               torch.mm(a_full, b1, out=mm_out1)),
            "matmul alone": lambda: torch.mm(a_full, b1, out=mm_out1),
        }
        rs = {
            "libsymmem fused": lambda: st.fused_matmul_reduce_scatter(h_act, b2, "sum", 0),
            "matmul+nccl reduce_scatter": lambda: (torch.mm(h_act, b2, out=mm_out2),
                                                   dist.reduce_scatter_tensor(rs_out, mm_out2)),
            "matmul alone": lambda: torch.mm(h_act, b2, out=mm_out2),
        }
        if symm_mem is not None and hasattr(torch.ops.symm_mem, "fused_all_gather_matmul"):
            ag["torch fused"] = lambda: torch.ops.symm_mem.fused_all_gather_matmul(a_shard, [b1], 0, gname,
                                                                                   return_A=False)
            rs["torch fused"] = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(h_act, b2, "sum", 0, gname)
        measure("ag+mm", f"{T}x{Hd}x{f}", ag, MM_ITERS, MM_EAGER_CALLS, rows)
        measure("mm+rs", f"{T}x{f}x{Hd}", rs, MM_ITERS, MM_EAGER_CALLS, rows)

    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump({"world": world, "rows": rows, "device": torch.cuda.get_device_name(dev),
                       "torch": torch.__version__, "symmem": symmem.version()}, fh)
    dist.barrier()
    dist.destroy_process_group()


def us_of(res, section, shape, impl, mode):
    for r in res["rows"]:
        if (r["section"], r["shape"], r["impl"], r["mode"]) == (section, shape, impl, mode):
            return r["us"]
    return None


def goals(res):
    """GOAL and EAGER lines; (met, missed)."""
    met = missed = 0

    def goal(tag, what, got, bound, ratio_of=None):
        nonlocal met, missed
        if got is None or bound is None:
            print(f"{tag} {what}: not measured", flush=True)
            missed += 1
            return
        ok = got <= bound
        met, missed = met + ok, missed + (not ok)
        extra = f" ({got / ratio_of:.3f}x)" if ratio_of else ""
        print(f"{tag} {'met ' if ok else 'MISSED'} {what}: {got:.2f} us against {bound:.2f} us{extra}", flush=True)

    for T, H in NORM_SHAPES:
        shape = f"{T}x{H}"
        fused = us_of(res, "norm", shape, "libsymmem fused", "graph")
        torch2 = us_of(res, "norm", shape, "torch two-shot+norm", "graph")
        if (T, H) == (1, 4096):
            goal("GOAL", f"norm {shape} fused <= 5 us", fused, 5.0)
        goal("GOAL", f"norm {shape} fused <= 0.5x torch two-shot+norm", fused, None if torch2 is None else 0.5 * torch2,
             torch2)
        goal("EAGER", f"norm {shape} fused <= 1.0x torch two-shot+norm", us_of(res, "norm", shape, "libsymmem fused", "eager"),
             us_of(res, "norm", shape, "torch two-shot+norm", "eager"), us_of(res, "norm", shape, "torch two-shot+norm", "eager"))
    for r in res["rows"]:
        if r["section"] in ("ag+mm", "mm+rs") and r["impl"] == "libsymmem fused" and r["mode"] == "graph":
            sec, shape = r["section"], r["shape"]
            theirs = us_of(res, sec, shape, "torch fused", "graph")
            floor = us_of(res, sec, shape, "matmul alone", "graph")
            goal("GOAL", f"{sec} {shape} fused <= 0.95x torch's", r["us"], None if theirs is None else 0.95 * theirs, theirs)
            goal("GOAL", f"{sec} {shape} fused <= 1.1x the matmul alone", r["us"], None if floor is None else 1.1 * floor, floor)
            seq = "nccl all_gather+matmul" if sec == "ag+mm" else "matmul+nccl reduce_scatter"
            te = us_of(res, sec, shape, "torch fused", "eager")
            goal("EAGER", f"{sec} {shape} fused <= 1.0x torch's", us_of(res, sec, shape, "libsymmem fused", "eager"), te, te)
            ne = us_of(res, sec, shape, seq, "eager")
            goal("EAGER", f"{sec} {shape} fused <= 1.0x {seq}", us_of(res, sec, shape, "libsymmem fused", "eager"), ne, ne)
    return met, missed


def table(res):
    lines = ["| section | shape | implementation | graph us | eager us |", "|---|---|---|---|---|"]
    seen = []
    for r in res["rows"]:
        key = (r["section"], r["shape"], r["impl"])
        if key in seen:
            continue
        seen.append(key)
        g, e = us_of(res, *key, "graph"), us_of(res, *key, "eager")
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {fmt(g)} | {fmt(e)} |")
    return "\n".join(lines)


def main():
    """Exit status: 0 when every rank ran and the results were written
    (missed goals are GOAL lines, not a failure); 1 otherwise."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/symmem-gpu"))
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--mm-tokens", type=int, default=8192)
    ap.add_argument("--mm-hidden", type=int, default=8192)
    ap.add_argument("--mm-inter", type=int, default=28672, help="the intermediate size, split over the ranks")
    ap.add_argument("--no-matmul", action="store_true")
    ap.add_argument("--no-eager", action="store_true")
    ap.add_argument("--child", nargs=4)
    a = ap.parse_args()
    mm = None if a.no_matmul else (a.mm_tokens, a.mm_hidden, a.mm_inter)
    if a.child:
        rank, world, port, path = a.child
        rank_main(int(rank), int(world), int(port), path, mm, not a.no_eager)
        return 0
    if mm and (a.mm_tokens % a.world or a.mm_inter % a.world):
        print(f"--mm-tokens {a.mm_tokens} and --mm-inter {a.mm_inter} must be multiples of --world {a.world}")
        return 1
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "tp_bench.json")
    if os.path.exists(path):
        os.remove(path)
    port = 29500 + os.getpid() % 1000
    env = dict(os.environ, SYMMEM_BACKEND="cuda", **NO_MULTICAST)
    args = ["--mm-tokens", str(a.mm_tokens), "--mm-hidden", str(a.mm_hidden), "--mm-inter", str(a.mm_inter)]
    args += (["--no-matmul"] if a.no_matmul else []) + (["--no-eager"] if a.no_eager else [])
    procs = [subprocess.Popen([sys.executable, __file__, *args, "--child", str(r), str(a.world), str(port), path], env=env)
             for r in range(a.world)]
    rc = [p.wait(timeout=1800) for p in procs]
    if any(rc) or not os.path.exists(path):
        print("ranks failed:", rc, flush=True)
        return 1
    with open(path) as f:
        res = json.load(f)
    res["command"] = " ".join([sys.executable] + sys.argv)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"device: {res['device']} x {res['world']}, torch {res['torch']}, libsymmem {res['symmem']}", flush=True)
    print(table(res), flush=True)
    met, missed = goals(res)
    print(f"goals: {met} met, {missed} missed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
