"""Collectives on 2 GPUs: libsymmem's kernels beside torch.ops.symm_mem
(one_shot_all_reduce, two_shot_all_reduce_) and NCCL (all_reduce,
all_gather_into_tensor, reduce_scatter_tensor), bf16, 4 KiB to 256 MiB, in
the same run; and the first-use compile and cached load of the kernels.

    python3 bench/coll_bench.py --out DIR [--world 2] [--max-mib 256] [--eager-max-kib 1024] [--checks-cost]

Timing: every op is captured in a CUDA graph of ITERS calls; the graph is
replayed REPS times between CUDA events, ranks lined up (torch.distributed
barrier + synchronize) before each replay, the replays of one size going
round-robin over the implementations; the figure is the median replay
divided by ITERS: GPU time per call, without Python's launch overhead (for
every implementation alike). Sizes: all_reduce and reduce_scatter the bytes
of each rank's input, all_gather the bytes of the output. Bus bandwidth as
nccl-tests: all_reduce size*2*(W-1)/W/t, the others size*(W-1)/W/t.
Eager rows (--eager-max-kib, default 1 MiB): uncaptured calls in a Python
loop between CUDA events, symmem.torch against torch's ops and NCCL, the
slowest rank. GOAL lines: libsymmem auto at most 0.95x the fastest other
(graph replays); EAGER lines: at most 0.95x torch two-shot (all_reduce) or
NCCL. Staging rows: symmem.torch.all_reduce on a tensor of torch's
allocator (through the group's staging workspace) beside the same call on
a tensor of symmem.torch.empty, graph replays up to 16 MiB and eager;
STAGING lines give the difference (goal: +1.5 us at most at 4 KiB). The run also prints its commit, device, driver and versions, and the
peer-copy floor (cudaMemcpyPeer, GPU 1 to GPU 0) beside the bus bandwidth
at 64 MiB and more; --checks-cost times auto all_reduce again without the
argument agreement (SYMMEM_COLL_UNCHECKED=1, measurement only).
Writes DIR/coll_bench.json and DIR/coll_bench.png (if matplotlib imports).
NVLink multicast is off for everyone (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
from bench_common import environment, latency_plot, peer_copy  # noqa: E402 - also turns NVLink multicast off for every process

ITERS = 20
REPS = 21


def sizes(max_mib, min_kib=4):
    s, out = min_kib << 10, []
    while s <= max_mib << 20:
        out.append(s)
        s *= 4
    return out


EAGER_CALLS = 50
EAGER_REPS = 7


def eager_rows(torch, dist, st, symm_mem, gname, rank, world, dev, max_kib):
    """Uncaptured calls, as a training loop makes them: EAGER_CALLS calls in
    a Python loop between CUDA events, after a warm-up; the slowest rank's
    time per call, median of EAGER_REPS, every implementation round-robin.
    libsymmem through symmem.torch (in place on a tensor of symmem.torch.empty),
    torch's symmetric-memory ops and NCCL through torch.distributed."""
    maxb = max_kib << 10
    sym = st.empty(maxb // 2, dtype=torch.bfloat16, device=dev).fill_(1)
    gout = torch.empty(maxb // 2 * world, dtype=torch.bfloat16, device=dev)
    nin = torch.ones(maxb // 2, dtype=torch.bfloat16, device=dev)
    plain = torch.ones(maxb // 2, dtype=torch.bfloat16, device=dev)  # torch's memory: staged
    if symm_mem is not None:
        tin = symm_mem.empty(maxb // 2, dtype=torch.bfloat16, device=dev).fill_(1)
        symm_mem.rendezvous(tin, gname)
    rows = []
    size = 4 << 10
    while size <= maxb:
        n = size // 2
        # Every tensor is sliced once, before the loop, for every implementation.
        v = {"sym": sym[:n], "sym_part": sym[: n // world], "out": gout[:n], "out_part": gout[: n // world],
             "nin": nin[:n], "nin_part": nin[: n // world], "plain": plain[:n]}
        impls = {
            ("all_reduce", "libsymmem auto"): lambda: st.all_reduce(v["sym"]),
            ("all_reduce", "libsymmem staged"): lambda: st.all_reduce(v["plain"]),
            ("all_reduce", "nccl"): lambda: dist.all_reduce(v["nin"]),
            ("all_gather", "libsymmem auto"): lambda: st.all_gather(v["sym_part"], out=v["out"]),
            ("all_gather", "nccl"): lambda: dist.all_gather_into_tensor(v["out"], v["nin_part"]),
            ("reduce_scatter", "libsymmem auto"): lambda: st.reduce_scatter(v["sym"], out=v["out_part"]),
            ("reduce_scatter", "nccl"): lambda: dist.reduce_scatter_tensor(v["out_part"], v["nin"]),
        }
        if symm_mem is not None:
            v["tin"] = tin[:n]
            impls[("all_reduce", "torch one-shot")] = lambda: torch.ops.symm_mem.one_shot_all_reduce(v["tin"], "sum", gname)
            impls[("all_reduce", "torch two-shot")] = lambda: torch.ops.symm_mem.two_shot_all_reduce_(v["tin"], "sum", gname)
        times = {k: [] for k in impls}
        for fn in impls.values():  # warm-up: first-use work (rendezvous, compile) out of the figures
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        for _ in range(EAGER_REPS):
            for key, fn in impls.items():
                dist.barrier()
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(EAGER_CALLS):
                    fn()
                b.record()
                b.synchronize()
                t = torch.tensor([a.elapsed_time(b) * 1e3 / EAGER_CALLS], device=dev)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                times[key].append(float(t.item()))
        for (coll, impl), ts in times.items():
            rows.append({"coll": coll, "impl": impl, "bytes": size, "us": statistics.median(ts)})
            if rank == 0:
                print(f"eager {coll:15s} {impl:28s} {size:>10d} B {rows[-1]['us']:9.2f} us per call", flush=True)
        size *= 4
    return rows






def rank_main(rank, world, port, max_mib, out_path, min_kib=4, only="", eager_max_kib=0):
    import torch
    import torch.distributed as dist

    import symmem
    import symmem.torch as st

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=dev)
    pg = dist.group.WORLD
    gname = pg.group_name
    try:
        import torch.distributed._symmetric_memory as symm_mem

        try:
            symm_mem.enable_symm_mem_for_group(gname)
        except Exception:
            pass
    except Exception:
        symm_mem = None
    g = symmem.Group(f"collbench-{port}", rank, world, device=rank, timeout=120)
    maxb = max_mib << 20
    ours_in = st.empty(2 * maxb, dtype=torch.uint8, device=dev)
    h = symmem.rendezvous(ours_in.data_ptr(), g)
    local = torch.empty(maxb * world, dtype=torch.uint8, device=dev)
    ours_in.fill_(1)
    if symm_mem is not None:
        t_in = symm_mem.empty(maxb // 2, dtype=torch.bfloat16, device=dev)
        symm_mem.rendezvous(t_in, gname)
        t_in.fill_(1)
    nccl_in = torch.ones(maxb // 2, dtype=torch.bfloat16, device=dev)
    nccl_out = torch.empty(maxb // 2 * world, dtype=torch.bfloat16, device=dev)
    # symmem.torch.all_reduce on a tensor of symmem.torch.empty (zero-copy)
    # and on one of torch's allocator (staged through the group's
    # workspace), up to STAGED_MAX_BYTES: the staging cost under replay.
    staged_max = min(maxb, STAGED_MAX_BYTES)
    st_sym = st.empty(staged_max // 2, dtype=torch.bfloat16, device=dev).fill_(1)
    st_plain = torch.ones(staged_max // 2, dtype=torch.bfloat16, device=dev)
    stream = torch.cuda.Stream(device=dev)

    from graph_timing import graph_timer, replay_round_robin

    capture, replay_us = graph_timer(torch, dist, stream, ITERS)

    rows = []
    warm = True  # the first size once more, untimed: clocks and first-use work settle before anything counts
    for size in [sizes(max_mib, min_kib)[0]] + sizes(max_mib, min_kib):
        n = size // 2  # bf16 elements
        cur = lambda: torch.cuda.current_stream(dev).cuda_stream
        # "libsymmem auto" is in place (as torch's two_shot_all_reduce_),
        # "libsymmem auto (out)" writes elsewhere (as torch's
        # one_shot_all_reduce); the algo= rows pin one algorithm.
        impls = {
            ("all_reduce", "libsymmem auto"): lambda: h.all_reduce("bfloat16", "sum", n, None, cur()),
            ("all_reduce", "libsymmem auto (out)"): lambda: h.all_reduce("bfloat16", "sum", n, local.data_ptr(), cur()),
            ("all_reduce", "libsymmem one-shot"): lambda: h.all_reduce("bfloat16", "sum", n, local.data_ptr(), cur(), algo="one_shot"),
            ("all_reduce", "libsymmem one-shot in place"): lambda: h.all_reduce("bfloat16", "sum", n, None, cur(), algo="one_shot"),
            ("all_reduce", "libsymmem two-shot"): lambda: h.all_reduce("bfloat16", "sum", n, None, cur(), algo="two_shot"),
            ("all_reduce", "libsymmem low-latency"): lambda: h.all_reduce("bfloat16", "sum", n, None, cur(), algo="low_latency"),
            ("all_reduce", "nccl"): lambda: dist.all_reduce(nccl_in[:n]),
            ("all_gather", "libsymmem auto"): lambda: h.all_gather("bfloat16", n // world, local.data_ptr(), cur()),
            ("all_gather", "nccl"): lambda: dist.all_gather_into_tensor(nccl_out[:n], nccl_in[: n // world]),
            ("reduce_scatter", "libsymmem auto"): lambda: h.reduce_scatter("bfloat16", "sum", n, local.data_ptr(), cur()),
            ("reduce_scatter", "nccl"): lambda: dist.reduce_scatter_tensor(nccl_out[: n // world], nccl_in[:n]),
        }
        if size <= staged_max:
            impls[("all_reduce", "libsymmem torch zero-copy")] = lambda: st.all_reduce(st_sym[:n])
            impls[("all_reduce", "libsymmem torch staged")] = lambda: st.all_reduce(st_plain[:n])
        if symm_mem is not None:
            if size <= (16 << 20):
                impls[("all_reduce", "torch one-shot")] = lambda: torch.ops.symm_mem.one_shot_all_reduce(t_in[:n], "sum", gname)
            impls[("all_reduce", "torch two-shot")] = lambda: torch.ops.symm_mem.two_shot_all_reduce_(t_in[:n], "sum", gname)
        if only:  # --only: the rows whose "coll impl" holds one of these words
            impls = {k: f for k, f in impls.items() if any(w in " ".join(k) for w in only.split(","))}
        def report(key, exc, warm=warm):
            if rank == 0 and not warm:
                print(f"{key[0]} {key[1]} {size}: {type(exc).__name__}: {exc}", flush=True)

        times = replay_round_robin(capture, replay_us, impls, 1 if warm else REPS, report)
        if warm:
            warm = False
            continue
        for (coll, impl) in impls:
            us = statistics.median(times[(coll, impl)]) if (coll, impl) in times else None
            factor = 2 * (world - 1) / world if coll == "all_reduce" else (world - 1) / world
            rows.append({"coll": coll, "impl": impl, "bytes": size, "us": us,
                         "busbw_GBps": None if not us else size * factor / us / 1e3})
            if rank == 0 and us is not None:
                print(f"{coll:15s} {impl:28s} {size:>10d} B {us:9.2f} us {rows[-1]['busbw_GBps']:8.1f} GB/s", flush=True)
    eager = eager_rows(torch, dist, st, symm_mem, gname, rank, world, dev, eager_max_kib) if eager_max_kib else []
    floor = peer_copy(torch, dist, rank, world, dev, maxb) if rank == 0 or world > 1 else None
    err = h.device_error()
    h.release()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"world": world, "rows": rows, "eager": eager, "peer_copy": floor, "device_error": err,
                       "device": torch.cuda.get_device_name(dev), "env": environment(torch)}, f)
    dist.barrier()
    dist.destroy_process_group()


# The first collective of a process, timed as a user sees it: a one-rank
# group, a 1 MiB bf16 in-place all-reduce, wall time to the end of the
# kernel, then the same call again.
FIRST_COLLECTIVE = """
import json, os, time, torch, symmem
torch.cuda.set_device(0)
g = symmem.Group("firstuse-%d" % os.getpid(), 0, 1, device=0, timeout=60)
p = symmem.alloc(1 << 20, 0)
h = symmem.rendezvous(p, g)
out = {}
for what in ("first_ms", "second_ms"):
    t0 = time.perf_counter()
    h.all_reduce("bfloat16", "sum", 1 << 19, None, 0)
    torch.cuda.synchronize()
    out[what] = (time.perf_counter() - t0) * 1e3
h.release()
print("FIRST", json.dumps(out))
"""


def kernel_load_times():
    """Each in a fresh process: the first collective (empty cache: NVRTC
    compiles its one kernel), then every kernel built at once by
    collectives_load into an empty cache, then loaded from that cache."""
    load = "import json, symmem; print('LOAD', json.dumps(symmem.collectives_load(0)))"
    out = {}
    for what, code, tag in (("first_collective", FIRST_COLLECTIVE, "FIRST "), ("first_use", load, "LOAD "),
                            ("cached", load, "LOAD ")):
        if what != "cached":
            cache = tempfile.mkdtemp()
        env = dict(os.environ, SYMMEM_CACHE_DIR=cache, SYMMEM_BACKEND="cuda",
                   PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        line = [l for l in r.stdout.splitlines() if l.startswith(tag)]
        out[what] = json.loads(line[-1][len(tag):]) if line else {"error": r.stderr[-2000:]}
    return out


def plot(res, path):
    panels = []
    for coll in ("all_reduce", "all_gather", "reduce_scatter"):
        rows = [r for r in res["rows"] if r["coll"] == coll and r["us"]]
        series = {impl: [(r["bytes"], r["us"]) for r in rows if r["impl"] == impl]
                  for impl in sorted({r["impl"] for r in rows})}
        panels.append((f"{coll}, bf16, {res['world']} x {res.get('device', 'GPU')}", series))
    return latency_plot(path, panels, "bytes", "GPU time per call (us)")


# The rows the goals judge: libsymmem's automatic choice (every call as a
# user makes it, no algo=), against the fastest of torch's symmetric-memory
# ops and NCCL for the same collective: met when at most GOAL_FACTOR times
# that.
AUTO_IMPLS = ("libsymmem auto", "libsymmem auto (out)")
GOAL_FACTOR = 0.95


def goals(res):
    """GOAL lines: per collective, size and libsymmem auto row, against the
    fastest non-libsymmem row. Returns (met, missed)."""
    met = missed = 0
    for coll in ("all_reduce", "all_gather", "reduce_scatter"):
        for size in sorted({r["bytes"] for r in res["rows"]}):
            rows = [r for r in res["rows"] if r["coll"] == coll and r["bytes"] == size and r["us"]]
            others = [r for r in rows if not r["impl"].startswith("libsymmem")]
            if not others:
                continue
            best = min(others, key=lambda r: r["us"])
            for r in rows:
                if r["impl"] not in AUTO_IMPLS:
                    continue
                ok = r["us"] <= GOAL_FACTOR * best["us"]
                met, missed = met + ok, missed + (not ok)
                print(f"GOAL {coll:15s} {size:>10d} B  {r['impl']:21s} {r['us']:9.2f} us  "
                      f"best other {best['us']:9.2f} us ({best['impl']})  {r['us'] / best['us']:.3f}x  {'OK' if ok else 'MISSED'}")
    return met, missed


# Staging (Note [Staging] in symmem/torch.py): the STAGING lines give the
# staged call's replay time over the zero-copy one's; the goal is at most
# STAGING_GOAL_US at 4 KiB.
STAGED_MAX_BYTES = 16 << 20
STAGING_GOAL_US = 1.5


def staging_lines(res):
    """STAGING lines: staged minus zero-copy symmem.torch all_reduce, per
    size (graph replays); (met, missed) of the 4 KiB goal."""
    met = missed = 0
    rows = {(r["impl"], r["bytes"]): r["us"] for r in res["rows"] if r["coll"] == "all_reduce" and r["us"]}
    for size in sorted({b for (_, b) in rows}):
        z, s_ = rows.get(("libsymmem torch zero-copy", size)), rows.get(("libsymmem torch staged", size))
        if z is None or s_ is None:
            continue
        judged = size == 4 << 10
        ok = s_ - z <= STAGING_GOAL_US
        if judged:
            met, missed = met + ok, missed + (not ok)
        print(f"STAGING all_reduce {size:>10d} B zero-copy {z:8.2f} us  staged {s_:8.2f} us  +{s_ - z:6.2f} us"
              + (f"  {'OK' if ok else 'MISSED'} (goal +{STAGING_GOAL_US} us)" if judged else ""), flush=True)
    eager = {(r["impl"], r["bytes"]): r["us"] for r in res.get("eager", []) if r["coll"] == "all_reduce"}
    for size in sorted({b for (_, b) in eager}):
        z, s_ = eager.get(("libsymmem auto", size)), eager.get(("libsymmem staged", size))
        if z is not None and s_ is not None:
            print(f"STAGING eager all_reduce {size:>10d} B zero-copy {z:8.2f} us  staged {s_:8.2f} us  "
                  f"+{s_ - z:6.2f} us", flush=True)
    return met, missed


def main():
    """Exit status: 0 when every rank ran and the results were written
    (goals missed are reported in the GOAL lines, not as a failure); 1 when
    a rank failed or wrote no results."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/symmem-gpu"))
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--max-mib", type=int, default=256)
    ap.add_argument("--min-kib", type=int, default=4)
    ap.add_argument("--only", default="", help="comma-separated words: time only the rows naming one (tuning runs)")
    ap.add_argument("--no-kernel-times", action="store_true")
    ap.add_argument("--eager-max-kib", type=int, default=1024,
                    help="eager (uncaptured) rows from 4 KiB up to this size (0: none)")
    ap.add_argument("--checks-cost", action="store_true",
                    help="also time auto all_reduce up to 1 MiB with SYMMEM_COLL_UNCHECKED=1 (the agreement's cost)")
    ap.add_argument("--child", nargs=4)
    ap.add_argument("--tables", metavar="JSON", help="print the markdown tables of a coll_bench.json and stop")
    a = ap.parse_args()
    if a.tables:
        with open(a.tables) as f:
            print(tables(json.load(f)))
        return 0
    if a.child:
        rank, world, port, path = a.child
        rank_main(int(rank), int(world), int(port), a.max_mib, path, a.min_kib, a.only, a.eager_max_kib)
        return 0
    os.makedirs(a.out, exist_ok=True)
    loads = {} if a.no_kernel_times else kernel_load_times()
    print("kernels:", json.dumps(loads), flush=True)
    path = os.path.join(a.out, "coll_bench.json")

    def ranks(path, extra_env, max_mib, only, eager_kib):
        port = 29500 + (os.getpid() + len(extra_env) * 7) % 1000
        env = dict(os.environ, SYMMEM_BACKEND="cuda", **extra_env)
        procs = [subprocess.Popen([sys.executable, __file__, "--max-mib", str(max_mib), "--min-kib", str(a.min_kib),
                                   "--only", only, "--eager-max-kib", str(eager_kib),
                                   "--child", str(r), str(a.world), str(port), path], env=env)
                 for r in range(a.world)]
        rc = [p.wait(timeout=1800) for p in procs]
        if any(rc) or not os.path.exists(path):
            print("ranks failed:", rc, "results:", path if os.path.exists(path) else "none", flush=True)
            return None
        with open(path) as f:
            return json.load(f)

    res = ranks(path, {}, a.max_mib, a.only, a.eager_max_kib)
    if res is None:
        return 1
    res["kernels"] = loads
    if a.checks_cost:
        cost = ranks(os.path.join(a.out, "coll_bench_unchecked.json"), {"SYMMEM_COLL_UNCHECKED": "1"}, 1,
                     "libsymmem auto", 0)
        if cost is not None:
            for r in cost["rows"]:
                if r["coll"] == "all_reduce" and r["impl"] in AUTO_IMPLS:
                    res["rows"].append(dict(r, impl=r["impl"] + " unchecked"))
            checked = {(r["bytes"], r["impl"]): r["us"] for r in res["rows"] if r["coll"] == "all_reduce"}
            for r in cost["rows"]:
                if r["coll"] == "all_reduce" and r["impl"] in AUTO_IMPLS and checked.get((r["bytes"], r["impl"])):
                    print(f"CHECKS cost {r['impl']:21s} {r['bytes']:>10d} B: {checked[(r['bytes'], r['impl'])]:8.2f} us "
                          f"with the agreement, {r['us']:8.2f} us without", flush=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print("plot:", plot(res, os.path.join(a.out, "coll_bench.png")), flush=True)
    print("environment:", json.dumps(res.get("env")), flush=True)
    floor = res.get("peer_copy")
    if floor:
        print(f"peer-copy floor: {floor['GBps']:.1f} GB/s", flush=True)
        for r in res["rows"]:
            if r["impl"] in AUTO_IMPLS and r["bytes"] >= 64 << 20 and r["busbw_GBps"]:
                print(f"BW {r['coll']:15s} {r['impl']:21s} {r['bytes']:>10d} B bus {r['busbw_GBps']:7.1f} GB/s = "
                      f"{r['busbw_GBps'] / floor['GBps']:.3f} x peer copy", flush=True)
    print(tables(res), flush=True)
    met, missed = goals(res)
    emet, emissed = eager_goals(res)
    smet, smissed = staging_lines(res)
    print(f"goals: {met} met, {missed} missed; eager: {emet} met, {emissed} missed; "
          f"staging: {smet} met, {smissed} missed", flush=True)
    return 0


def tables(res):
    """The markdown tables of README and docs/measurements.md: graph
    replays (all_reduce, then all_gather and reduce_scatter) and eager
    calls, µs per call."""
    def fmt(v):
        return "–" if v is None else (f"{v:.2f}" if v < 100 else f"{v:.1f}")

    def kib(b):
        return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"

    def pick(rows, coll, impl, size):
        for r in rows:
            if r["coll"] == coll and r["impl"] == impl and r["bytes"] == size:
                return r["us"]
        return None

    rows, sizes = res["rows"], sorted({r["bytes"] for r in res["rows"]})
    out = ["| size | ours auto (in place) | ours auto (out of place) | torch one-shot | torch two-shot | NCCL |",
           "|---|---:|---:|---:|---:|---:|"]
    for b in sizes:
        out.append(f"| {kib(b)} | " + " | ".join(fmt(pick(rows, "all_reduce", i, b)) for i in
                   ("libsymmem auto", "libsymmem auto (out)", "torch one-shot", "torch two-shot", "nccl")) + " |")
    out += ["", "| size | all_gather ours | all_gather NCCL | reduce_scatter ours | reduce_scatter NCCL |",
            "|---|---:|---:|---:|---:|"]
    for b in sizes:
        out.append(f"| {kib(b)} | {fmt(pick(rows, 'all_gather', 'libsymmem auto', b))} | {fmt(pick(rows, 'all_gather', 'nccl', b))} | "
                   f"{fmt(pick(rows, 'reduce_scatter', 'libsymmem auto', b))} | {fmt(pick(rows, 'reduce_scatter', 'nccl', b))} |")
    eager = res.get("eager") or []
    if eager:
        out += ["", "| size, uncaptured | all_reduce ours | torch two-shot | torch one-shot | NCCL | all_gather ours | NCCL | reduce_scatter ours | NCCL |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for b in sorted({r["bytes"] for r in eager}):
            vals = [pick(eager, "all_reduce", i, b) for i in ("libsymmem auto", "torch two-shot", "torch one-shot", "nccl")]
            vals += [pick(eager, c, i, b) for c in ("all_gather", "reduce_scatter") for i in ("libsymmem auto", "nccl")]
            out.append(f"| {kib(b)} | " + " | ".join(fmt(v) for v in vals) + " |")
    return "\n".join(out)


EAGER_FACTOR = 0.95


def eager_goals(res):
    """EAGER lines: libsymmem's uncaptured call against torch two-shot's
    (all_reduce) or NCCL's (the others) in the same loop."""
    met = missed = 0
    for coll in ("all_reduce", "all_gather", "reduce_scatter"):
        for size in sorted({r["bytes"] for r in res.get("eager", [])}):
            rows = {r["impl"]: r["us"] for r in res["eager"] if r["coll"] == coll and r["bytes"] == size}
            ref = "torch two-shot" if coll == "all_reduce" and "torch two-shot" in rows else "nccl"
            if "libsymmem auto" not in rows or ref not in rows:
                continue
            ok = rows["libsymmem auto"] <= EAGER_FACTOR * rows[ref]
            met, missed = met + ok, missed + (not ok)
            print(f"EAGER {coll:15s} {size:>10d} B libsymmem {rows['libsymmem auto']:8.2f} us  {ref} {rows[ref]:8.2f} us  "
                  f"{rows['libsymmem auto'] / rows[ref]:.3f}x  {'OK' if ok else 'MISSED'}", flush=True)
    return met, missed


if __name__ == "__main__":
    sys.exit(main())
