"""The copy-engine collectives on 2 GPUs (docs/speed.md, "Collectives on
the copy engines"), all in one run:

1. The copy engines' ceiling: peer copies (copy_ between the GPUs:
   cudaMemcpyPeerAsync) of --ceiling-mib each way, one direction alone and
   both directions at once (a stream per GPU, started together).
2. all_gather, reduce_scatter and all_reduce (bf16) from 1 MiB to
   --max-mib of each rank's input: libsymmem's copy-engine mode
   (algo "copy_engine"), libsymmem's SM kernels (auto), NCCL, and
   torch.ops.symm_mem's one_shot_all_reduce / two_shot_all_reduce_ (the
   all-reduce only: torch has no copy-engine or SM all-gather of its own
   without NVLink multicast, which stays off). GPU time per call: every
   op captured in a CUDA graph of ITERS calls, the graph replayed REPS
   times between CUDA events with the ranks lined up before each replay,
   implementations of one size round-robin; the median replay / ITERS.
   Bus bandwidth as nccl-tests: all_gather and reduce_scatter
   size*(W-1)/W/t of the gathered or scattered whole (all_gather: W*size),
   all_reduce size*2*(W-1)/W/t.
3. The overlap: a bf16 matmul of --mm (8192x8192x8192) alone on the main
   stream, then beside an all-gather of --overlap-mib (64 MiB) per rank on
   another stream, started together: copy-engine mode, SM kernels, NCCL.
   For each: the matmul's own time (start to its end event), the total
   (start to the later of both ends), and the matmul's slowdown against
   alone; medians of REPS, ranks lined up before each.

    python3 bench/ce_bench.py --out DIR [--max-mib 256] [--ceiling-mib 256] [--overlap-mib 64] [--mm 8192]

Prints the tables and writes DIR/ce_bench.json. NVLink multicast is off for
everyone (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import bench_common  # noqa: E402,F401 - its import turns NVLink multicast off for every process

ITERS = 10
REPS = 15
WORLD = 2


def sizes(max_mib):
    s, out = 1 << 20, []
    while s <= max_mib << 20:
        out.append(s)
        s *= 4
    return out


def ceiling(torch, nbytes):
    """Peer copies of nbytes between GPU 0 and GPU 1 (one process): GB/s
    per direction, one direction alone and both at once."""
    d0, d1 = torch.device("cuda", 0), torch.device("cuda", 1)
    a0 = torch.ones(nbytes, dtype=torch.uint8, device=d0)
    a1 = torch.ones(nbytes, dtype=torch.uint8, device=d1)
    b0 = torch.empty(nbytes, dtype=torch.uint8, device=d0)
    b1 = torch.empty(nbytes, dtype=torch.uint8, device=d1)
    # torch copies between devices on the source device's current stream,
    # after the destination's current stream and before it (events). Each
    # copy gets a stream of its own on its source device (s0, s1) and a
    # destination-side stream of its own (t0, t1): on a device's default
    # stream, or on a stream that the other copy's ordering waits on, the
    # two directions would run one after the other.
    s0, s1 = torch.cuda.Stream(device=d0), torch.cuda.Stream(device=d1)
    t0, t1 = torch.cuda.Stream(device=d0), torch.cuda.Stream(device=d1)

    def one():
        with torch.cuda.stream(s1), torch.cuda.stream(t0):
            b0.copy_(a1, non_blocking=True)  # GPU 1 -> GPU 0, on s1

    def both():
        one()
        with torch.cuda.stream(s0), torch.cuda.stream(t1):
            b1.copy_(a0, non_blocking=True)  # GPU 0 -> GPU 1, on s0, at the same time

    def timed(fn):
        torch.cuda.synchronize(d0)
        torch.cuda.synchronize(d1)
        start = torch.cuda.Event(enable_timing=True)
        start.record(s0)
        s1.wait_event(start)
        fn()
        end1 = torch.cuda.Event()
        end1.record(s1)
        s0.wait_event(end1)  # s0: its own copy (both), then GPU 1's
        end = torch.cuda.Event(enable_timing=True)
        end.record(s0)
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    out = {}
    for name, fn in (("one direction", one), ("both directions", both)):
        timed(fn)
        t = statistics.median(timed(fn) for _ in range(REPS))
        out[name] = {"bytes": nbytes, "us": t * 1e6, "GBps_per_direction": nbytes / t / 1e9}
    return out


def rank_main(rank, port, a, out_path):
    import datetime

    import torch
    import torch.distributed as dist

    import symmem
    import symmem.torch as st

    world = WORLD
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=dev,
                            timeout=datetime.timedelta(seconds=300))
    gname = dist.group.WORLD.group_name
    try:
        import torch.distributed._symmetric_memory as symm_mem

        try:
            symm_mem.enable_symm_mem_for_group(gname)
        except Exception:  # noqa: BLE001 - newer torch needs none
            pass
    except Exception:  # noqa: BLE001 - reported as missing rows
        symm_mem = None
    res = {"world": world, "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "libsymmem": getattr(symmem, "__version__", "?")}
    if rank == 0:
        res["ceiling"] = ceiling(torch, a.ceiling_mib << 20)
        for name, r in res["ceiling"].items():
            print(f"ceiling {name:16s} {r['bytes']:>11d} B {r['us']:9.1f} us {r['GBps_per_direction']:7.1f} GB/s per direction",
                  flush=True)
    dist.barrier()

    g = symmem.Group(f"cebench-{port}", rank, world, device=rank, timeout=120)
    maxb = max(a.max_mib, a.overlap_mib) << 20
    sym = st.empty(2 * maxb, dtype=torch.uint8, device=dev).fill_(1)
    h = symmem.rendezvous(sym.data_ptr(), g)
    local = torch.empty(maxb * world, dtype=torch.uint8, device=dev)
    nccl_in = torch.ones(maxb // 2, dtype=torch.bfloat16, device=dev)
    nccl_out = torch.empty(maxb // 2 * world, dtype=torch.bfloat16, device=dev)
    t_in = None
    if symm_mem is not None:
        try:
            t_in = symm_mem.empty(a.max_mib << 19, dtype=torch.bfloat16, device=dev).fill_(1)
            symm_mem.rendezvous(t_in, gname)
        except Exception as exc:  # noqa: BLE001 - reported, the rest runs
            if rank == 0:
                print(f"torch symmetric memory unavailable: {type(exc).__name__}: {exc}", flush=True)
            t_in = None
    stream = torch.cuda.Stream(device=dev)
    from graph_timing import graph_timer, replay_round_robin

    capture, replay_us = graph_timer(torch, dist, stream, ITERS)
    cur = lambda: torch.cuda.current_stream(dev).cuda_stream  # noqa: E731
    rows = []
    for size in sizes(a.max_mib):
        n = size // 2  # bf16 elements of each rank's input
        ce, sm = {"algo": "copy_engine"}, {}
        impls = {
            ("all_gather", "libsymmem copy_engine"): lambda: h.all_gather("bfloat16", n, local.data_ptr(), cur(), **ce),
            ("all_gather", "libsymmem SM auto"): lambda: h.all_gather("bfloat16", n, local.data_ptr(), cur(), **sm),
            ("all_gather", "nccl"): lambda: dist.all_gather_into_tensor(nccl_out[: n * world], nccl_in[:n]),
            ("reduce_scatter", "libsymmem copy_engine"): lambda: h.reduce_scatter("bfloat16", "sum", n, local.data_ptr(), cur(), **ce),
            ("reduce_scatter", "libsymmem SM auto"): lambda: h.reduce_scatter("bfloat16", "sum", n, local.data_ptr(), cur(), **sm),
            ("reduce_scatter", "nccl"): lambda: dist.reduce_scatter_tensor(nccl_out[: n // world], nccl_in[:n]),
            ("all_reduce", "libsymmem copy_engine"): lambda: h.all_reduce("bfloat16", "sum", n, None, cur(), **ce),
            ("all_reduce", "libsymmem copy_engine (out)"): lambda: h.all_reduce("bfloat16", "sum", n, local.data_ptr(), cur(), **ce),
            ("all_reduce", "libsymmem SM auto"): lambda: h.all_reduce("bfloat16", "sum", n, None, cur(), **sm),
            ("all_reduce", "libsymmem SM auto (out)"): lambda: h.all_reduce("bfloat16", "sum", n, local.data_ptr(), cur(), **sm),
            ("all_reduce", "nccl"): lambda: dist.all_reduce(nccl_in[:n]),
        }
        if t_in is not None:
            if size <= (16 << 20):
                impls[("all_reduce", "torch one-shot")] = lambda: torch.ops.symm_mem.one_shot_all_reduce(t_in[:n], "sum", gname)
            impls[("all_reduce", "torch two-shot")] = lambda: torch.ops.symm_mem.two_shot_all_reduce_(t_in[:n], "sum", gname)
        def report(key, exc):
            if rank == 0:
                print(f"{key[0]} {key[1]} {size}: {type(exc).__name__}: {exc}", flush=True)

        times = replay_round_robin(capture, replay_us, impls, REPS, report)
        for (coll, impl) in impls:
            us = statistics.median(times[(coll, impl)]) if (coll, impl) in times else None
            whole = size * world if coll == "all_gather" else size
            factor = 2 * (world - 1) / world if coll == "all_reduce" else (world - 1) / world
            rows.append({"coll": coll, "impl": impl, "bytes": size, "us": us,
                         "busbw_GBps": None if not us else whole * factor / us / 1e3})
            if rank == 0 and us is not None:
                print(f"{coll:15s} {impl:28s} {size:>11d} B {us:9.1f} us {rows[-1]['busbw_GBps']:7.1f} GB/s", flush=True)
    res["rows"] = rows
    res["overlap"] = overlap(torch, dist, h, local, nccl_in, nccl_out, rank, world, dev, a)
    res["device_error"] = h.device_error()
    h.release()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def overlap(torch, dist, h, local, nccl_in, nccl_out, rank, world, dev, a):
    """The matmul alone, then beside a 64 MiB all-gather on another stream
    (section 3 of the module's text)."""
    m = a.mm
    x = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    y = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    z = torch.empty(m, m, dtype=torch.bfloat16, device=dev)
    main, side = torch.cuda.current_stream(dev), torch.cuda.Stream(device=dev)
    n = (a.overlap_mib << 20) // 2
    gathers = {
        None: None,
        "libsymmem copy_engine": lambda: h.all_gather("bfloat16", n, local.data_ptr(), side.cuda_stream, algo="copy_engine"),
        "libsymmem SM auto": lambda: h.all_gather("bfloat16", n, local.data_ptr(), side.cuda_stream),
        "nccl": lambda: dist.all_gather_into_tensor(nccl_out[: n * world], nccl_in[:n]),
    }

    def once(gather):
        dist.barrier()
        torch.cuda.synchronize(dev)
        start, mm_end, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record(main)
        if gather is not None:
            side.wait_event(start)
            with torch.cuda.stream(side):
                gather()
        torch.matmul(x, y, out=z)
        mm_end.record(main)
        if gather is not None:
            main.wait_stream(side)
        end.record(main)
        end.synchronize()
        return start.elapsed_time(mm_end) * 1e3, start.elapsed_time(end) * 1e3

    out = []
    alone = None
    for name, gather in gathers.items():
        once(gather)  # warm-up (first-use work, clocks)
        runs = [once(gather) for _ in range(REPS)]
        mm_us = statistics.median(r[0] for r in runs)
        total_us = statistics.median(r[1] for r in runs)
        if name is None:
            alone = mm_us
        label = "matmul alone" if name is None else f"beside {name}"
        row = {"what": label, "matmul_us": mm_us, "total_us": total_us,
               "slowdown": mm_us / alone if alone else None}
        out.append(row)
        if rank == 0:
            print(f"overlap {label:34s} matmul {mm_us:9.1f} us total {total_us:9.1f} us "
                  f"matmul x{row['slowdown']:.3f}", flush=True)
    # The all-gathers alone on the side stream, for the sum "in sequence".
    for name in ("libsymmem copy_engine", "libsymmem SM auto", "nccl"):
        gather = gathers[name]

        def alone_ag():
            dist.barrier()
            torch.cuda.synchronize(dev)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(side)
            with torch.cuda.stream(side):
                gather()
            e.record(side)
            e.synchronize()
            return s.elapsed_time(e) * 1e3

        alone_ag()
        us = statistics.median(alone_ag() for _ in range(REPS))
        out.append({"what": f"{name} all_gather alone", "total_us": us})
        if rank == 0:
            print(f"overlap {name + ' all_gather alone':34s} {us:9.1f} us (in sequence with the matmul: "
                  f"{us + alone:9.1f} us)", flush=True)
    return out


def table(res):
    lines = ["| collective | MiB per rank | " + " | ".join(IMPLS) + " |", "|---|---:|" + "---:|" * len(IMPLS)]
    by = {(r["coll"], r["impl"], r["bytes"]): r for r in res.get("rows", [])}
    for coll in ("all_gather", "reduce_scatter", "all_reduce"):
        for size in sorted({r["bytes"] for r in res.get("rows", [])}):
            cells = []
            for impl in IMPLS:
                r = by.get((coll, impl, size))
                cells.append("" if r is None or r["us"] is None else f"{r['us']:.1f} us ({r['busbw_GBps']:.0f} GB/s)")
            lines.append(f"| {coll} | {size >> 20} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


IMPLS = ["libsymmem copy_engine", "libsymmem copy_engine (out)", "libsymmem SM auto", "libsymmem SM auto (out)", "nccl",
         "torch one-shot", "torch two-shot"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/symmem-gpu"))
    ap.add_argument("--max-mib", type=int, default=256)
    ap.add_argument("--ceiling-mib", type=int, default=256)
    ap.add_argument("--overlap-mib", type=int, default=64)
    ap.add_argument("--mm", type=int, default=8192, help="the matmul's m = n = k")
    ap.add_argument("--child", nargs=3)
    a = ap.parse_args()
    if a.child:
        rank, port, path = a.child
        rank_main(int(rank), int(port), a, path)
        return 0
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "ce_bench.json")
    port = 29500 + os.getpid() % 1000
    env = dict(os.environ, SYMMEM_BACKEND="cuda")
    procs = [subprocess.Popen([sys.executable, __file__, "--max-mib", str(a.max_mib), "--ceiling-mib", str(a.ceiling_mib),
                               "--overlap-mib", str(a.overlap_mib), "--mm", str(a.mm), "--child", str(r), str(port), path],
                              env=env) for r in range(WORLD)]
    rc = [p.wait(timeout=1800) for p in procs]
    if any(rc) or not os.path.exists(path):
        print("ranks failed:", rc, flush=True)
        return 1
    with open(path) as f:
        res = json.load(f)
    print(table(res), flush=True)
    for r in res.get("overlap", []):
        if "matmul_us" in r:
            print(f"| {r['what']} | matmul {r['matmul_us']:.1f} us | total {r['total_us']:.1f} us | x{r['slowdown']:.3f} |")
    print(f"results: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
