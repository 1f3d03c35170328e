"""Symmetric-memory benchmarks: rendezvous (cold, warm, second allocation),
barrier latency and peer copy bandwidth, beside torch symmetric memory and
cudaMemcpyPeer measured in the same run.

    python3 bench/symm_bench.py --out DIR              # GPUs: one rank per GPU
    python3 bench/symm_bench.py --host --ranks 2 4 8   # host backend, CPU processes

Each rank is a process; ranks line up on a barrier before every timed step,
so a collective's time is that of the slowest rank. Medians are reported.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def ms(t0):
    return (time.perf_counter() - t0) * 1e3


def host_rank(rank, world, name, out):
    import symmem
    r = {}
    with symmem.Group(name, rank, world, timeout=60) as g:
        buf = symmem.empty(1 << 20)
        t0 = time.perf_counter()
        h = symmem.rendezvous(buf, g)
        r["cold_ms"] = ms(t0)
        h.barrier(timeout=60)
        warm = []
        for _ in range(200):
            h.barrier(timeout=60)
            t0 = time.perf_counter()
            h2 = symmem.rendezvous(buf, g)
            warm.append(ms(t0))
            h2.release()
        r["warm_ms"] = statistics.median(warm)
        r["warm_p10_ms"] = sorted(warm)[len(warm) // 10]
        n = 2000
        h.barrier(timeout=60)
        t0 = time.perf_counter()
        for _ in range(n):
            h.barrier(timeout=60)
        r["barrier_us"] = ms(t0) / n * 1e3
        # Group creation: ranks line up on the first group's barrier, then
        # make (and destroy) a new group of another name.
        create = []
        for i in range(20):
            h.barrier(timeout=60)
            t0 = time.perf_counter()
            g2 = symmem.Group(f"{name}-g{i}", rank, world, timeout=60)
            create.append(ms(t0))
            g2.destroy()
        r["create_ms"] = statistics.median(create)
        h.release()
        buf.free()
    with open(out, "w") as f:
        json.dump(r, f)


def gpu_rank(rank, world, name, port, out, variant="full"):
    """variant: full (libsymmem beside torch), or only (libsymmem alone: for
    the sockets comparison and for more ranks than GPUs, where NCCL and torch
    symmetric memory cannot run; ranks then share GPUs round-robin)."""
    import torch
    import torch.distributed as dist
    import symmem
    import symmem.torch as st
    dev = rank % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    if variant == "full":
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                device_id=torch.device("cuda", dev))
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    r = {}
    # --- libsymmem
    dist.barrier()
    t0 = time.perf_counter()
    g = symmem.Group(name, rank, world, device=dev, timeout=120)
    r["symmem_group_create_ms"] = ms(t0)  # the first group: includes the library's start-up
    again = []
    for i in range(10):
        dist.barrier()
        t0 = time.perf_counter()
        g2 = symmem.Group(f"{name}-again{i}", rank, world, device=dev, timeout=120)
        again.append(ms(t0))
        g2.destroy()
    r["symmem_group_again_ms"] = statistics.median(again)
    buf = symmem.empty(1 << 20, device=dev)
    dist.barrier()
    t0 = time.perf_counter()
    h = symmem.rendezvous(buf, g)
    r["symmem_cold_ms"] = ms(t0)
    warm = []
    for _ in range(30):
        dist.barrier()
        t0 = time.perf_counter()
        h2 = symmem.rendezvous(buf, g)
        warm.append(ms(t0))
        h2.release()
    r["symmem_warm_ms"] = statistics.median(warm)
    # The same, 200 in a row after one line-up: the ranks pace each other
    # through the all-gather, so the per-call figure is the call's own cost
    # rather than how far apart the ranks left the line-up barrier.
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(200):
        symmem.rendezvous(buf, g).release()
    r["symmem_warm_loop_us"] = ms(t0) / 200 * 1e3
    if variant != "full":
        stream = torch.cuda.current_stream()
        h.barrier(stream=stream.cuda_stream)
        torch.cuda.synchronize()
        dist.barrier()
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            h.barrier(stream=stream.cuda_stream)
        torch.cuda.synchronize()
        r["symmem_barrier_us"] = ms(t0) / n * 1e3
        dist.barrier()
        h.release()
        g.destroy()
        with open(out, "w") as f:
            json.dump(r, f)
        dist.destroy_process_group()
        return
    buf2 = symmem.empty(64 << 20, device=rank)
    dist.barrier()
    t0 = time.perf_counter()
    h3 = symmem.rendezvous(buf2, g)
    r["symmem_second_alloc_ms"] = ms(t0)
    stream = torch.cuda.current_stream()
    for _ in range(20):
        h.barrier(stream=stream.cuda_stream)
    torch.cuda.synchronize()
    dist.barrier()
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        h.barrier(stream=stream.cuda_stream)
    r["symmem_barrier_enqueue_us"] = ms(t0) / n * 1e3  # host time to queue one
    torch.cuda.synchronize()
    r["symmem_barrier_us"] = ms(t0) / n * 1e3
    # peer copy: read the peer's 256 MiB buffer into local memory
    nbytes = 256 << 20
    t = st.empty(nbytes, dtype=torch.uint8, device=f"cuda:{rank}")
    t.fill_(rank + 1)
    th = st.rendezvous(t, g)
    th.barrier(stream=stream.cuda_stream)
    torch.cuda.synchronize()
    dist.barrier()
    # Every rank reads every peer's buffer at once (all-to-all; with two
    # ranks, one peer): bandwidth per GPU is the bytes it read per second.
    peers = [(rank + k) % world for k in range(1, world)]
    srcs = [th.get_buffer(p, (nbytes,), torch.uint8) for p in peers]
    dst = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{rank}")
    ok = True
    for p, src in zip(peers, srcs):
        dst.copy_(src)
        torch.cuda.synchronize()
        ok = ok and bool((dst == p + 1).all().item())
    r["symmem_peer_data_ok"] = ok
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(10):
        for src in srcs:
            dst.copy_(src)
    torch.cuda.synchronize()
    r["symmem_peer_copy_GBs"] = 10 * len(srcs) * nbytes / (time.perf_counter() - t0) / 1e9
    th.barrier(stream=stream.cuda_stream)
    torch.cuda.synchronize()
    # --- torch symmetric memory, same process, same GPUs
    import torch.distributed._symmetric_memory as symm_mem
    try:
        symm_mem.enable_symm_mem_for_group(dist.group.WORLD.group_name)
    except Exception:
        pass
    x = symm_mem.empty(1 << 18, dtype=torch.float32, device=f"cuda:{rank}")
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    th1 = symm_mem.rendezvous(x, dist.group.WORLD)
    torch.cuda.synchronize()
    r["torch_cold_ms"] = ms(t0)
    warm = []
    for _ in range(30):
        dist.barrier()
        t0 = time.perf_counter()
        symm_mem.rendezvous(x, dist.group.WORLD)
        warm.append(ms(t0))
    r["torch_warm_same_tensor_ms"] = statistics.median(warm)
    # symmem.torch.rendezvous again on a tensor whose handle is held: the
    # agreed handle, no exchange (Note [Rendezvous again]), as torch's.
    ts = st.empty(1 << 18, dtype=torch.float32, device=f"cuda:{rank}")
    held = st.rendezvous(ts, dist.group.WORLD)
    torch.cuda.synchronize()
    warm = []
    for _ in range(30):
        dist.barrier()
        t0 = time.perf_counter()
        again = st.rendezvous(ts, dist.group.WORLD)
        warm.append(ms(t0))
        again.release()
    r["symmem_torch_warm_same_tensor_ms"] = statistics.median(warm)
    held.release()
    x2 = symm_mem.empty(64 << 20, dtype=torch.uint8, device=f"cuda:{rank}")
    dist.barrier()
    t0 = time.perf_counter()
    symm_mem.rendezvous(x2, dist.group.WORLD)
    torch.cuda.synchronize()
    r["torch_second_alloc_ms"] = ms(t0)
    for _ in range(20):
        th1.barrier()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        th1.barrier()
    r["torch_barrier_enqueue_us"] = ms(t0) / n * 1e3
    torch.cuda.synchronize()
    r["torch_barrier_us"] = ms(t0) / n * 1e3
    dist.barrier()
    h.release(); h3.release(); th.release()
    g.destroy()
    with open(out, "w") as f:
        json.dump(r, f)
    dist.destroy_process_group()


def spawn(world, args, tmp, env=None):
    procs, outs = [], []
    for rank in range(world):
        o = os.path.join(tmp, f"rank{rank}.json")
        outs.append(o)
        procs.append(subprocess.Popen([sys.executable, __file__, "--child", str(rank), str(world)] + args + [o],
                                      env=dict(os.environ, **(env or {}))))
    for p in procs:
        if p.wait(timeout=600) != 0:
            raise RuntimeError(f"a rank failed with {p.returncode}")
    return [json.load(open(o)) for o in outs]


def peer_copy_baseline():
    """cudaMemcpyPeer through torch: GPU1 -> GPU0, 256 MiB."""
    import torch
    x = torch.full((256 << 20,), 2, dtype=torch.uint8, device="cuda:1")
    y = torch.empty_like(x, device="cuda:0")
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize(0); torch.cuda.synchronize(1)
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize(0); torch.cuda.synchronize(1)
    return 10 * x.numel() / (time.perf_counter() - t0) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", action="store_true")
    ap.add_argument("--ranks", type=int, nargs="*", default=[2, 4, 8])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=0, help="ranks on the GPUs (default: every GPU)")
    ap.add_argument("--world-sizes", type=int, nargs="*", default=[],
                    help="more world sizes for the libsymmem-alone table (ranks share GPUs when there are fewer: "
                         "a check that it runs, not a timing to report)")
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--child", nargs="*")
    a = ap.parse_args()
    if a.child:
        # One CPU per rank, the same for every figure of the run (the host
        # side of a barrier loop is a few µs; where the scheduler put a rank
        # moved it by as much as the difference being measured).
        cpus = sorted(os.sched_getaffinity(0))
        rank = int(a.child[0])
        if len(cpus) >= rank + 3:
            os.sched_setaffinity(0, {cpus[2 + rank]})
        if a.child[2] == "host":
            host_rank(int(a.child[0]), int(a.child[1]), a.child[3], a.child[4])
        else:
            gpu_rank(int(a.child[0]), int(a.child[1]), a.child[3], int(a.child[4]), a.child[6], a.child[5])
        return
    os.makedirs(a.out, exist_ok=True)
    import tempfile
    tmp = tempfile.mkdtemp()
    lines = []
    goal_lines = []
    if a.host:
        lines += [f"Host backend ({os.cpu_count()} CPUs), medians of {a.reps} runs, slowest rank; records through the shared-memory "
                  "control page (page) or the sockets (SYMMEM_SHM_EXCHANGE=0):", "",
                  "| ranks | records | group creation (ms) | cold rendezvous (ms) | warm rendezvous, median (10th percentile) (µs) | barrier (µs) |",
                  "|---|---|---|---|---|---|"]
        for world in a.ranks:
            for mode, flag in (("page", "1"), ("sockets", "0")):
                runs = []
                for rep in range(a.reps):
                    rs = spawn(world, ["host", f"bench-host-{os.getpid()}-{world}-{mode}-{rep}"], tmp,
                               {"SYMMEM_BACKEND": "host", "SYMMEM_SHM_EXCHANGE": flag, "SYMMEM_BARRIER": "linear"})
                    runs.append({k: max(r[k] for r in rs) for k in rs[0]})
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                lines.append(f"| {world} | {mode} | {med['create_ms']:.2f} | {med['cold_ms']:.2f} | {med['warm_ms'] * 1e3:.0f} ({med['warm_p10_ms'] * 1e3:.0f}) | {med['barrier_us']:.1f} |")
    else:
        import torch
        n = torch.cuda.device_count()
        if n < 2:
            raise SystemExit("symm_bench needs two or more GPUs (use --host for the host backend)")
        dev = torch.cuda.get_device_name(0)
        base = [peer_copy_baseline() for _ in range(a.reps)]
        world = min(a.gpus or n, n)
        runs = []
        for rep in range(a.reps):
            rs = spawn(world, ["gpu", f"bench-gpu-{os.getpid()}-{rep}", str(29600 + rep), "full"], tmp)
            runs.append({k: (max(r[k] for r in rs) if not isinstance(rs[0][k], bool) else all(r[k] for r in rs))
                         for k in rs[0]})
            runs[-1]["symmem_peer_copy_GBs"] = min(r["symmem_peer_copy_GBs"] for r in rs)
        med = {k: statistics.median(r[k] for r in runs) if not isinstance(runs[0][k], bool) else all(r[k] for r in runs)
               for k in runs[0]}
        copy_base = statistics.median(base)
        lines += [f"{world} × {dev} (NVLink), one rank per GPU (each pinned to one CPU), torch {torch.__version__}; medians of {a.reps} runs, slowest rank:", "",
                  "| figure | libsymmem | torch symmetric memory / cudaMemcpyPeer |", "|---|---|---|",
                  f"| group creation, the first (library start-up included) | {med['symmem_group_create_ms']:.2f} ms | (init_process_group, not timed) |",
                  f"| group creation, another group | {med['symmem_group_again_ms']:.2f} ms | |",
                  f"| first rendezvous (1 MiB) | {med['symmem_cold_ms']:.2f} ms | {med['torch_cold_ms']:.2f} ms |",
                  f"| rendezvous again, same buffer | {med['symmem_warm_ms'] * 1e3:.0f} µs | {med['torch_warm_same_tensor_ms'] * 1e3:.0f} µs (cached handle) |",
                  f"| the same, 200 in a row (per call) | {med['symmem_warm_loop_us']:.0f} µs | |",
                  f"| symmem.torch.rendezvous again, handle held | {med['symmem_torch_warm_same_tensor_ms'] * 1e3:.1f} µs | {med['torch_warm_same_tensor_ms'] * 1e3:.1f} µs (cached handle) |",
                  f"| rendezvous of a second allocation (64 MiB) | {med['symmem_second_alloc_ms']:.2f} ms | {med['torch_second_alloc_ms']:.2f} ms |",
                  f"| barrier, {world} ranks, 2000 in a row on a stream | {med['symmem_barrier_us']:.1f} µs | {med['torch_barrier_us']:.1f} µs |",
                  f"| host time per barrier call (waits when the stream's queue is full) | {med['symmem_barrier_enqueue_us']:.1f} µs | {med['torch_barrier_enqueue_us']:.1f} µs |",
                  f"| peer read 256 MiB from {'each of ' if world > 2 else ''}{world - 1} peer{'s at once' if world > 2 else ''}, per GPU (slowest) | {med['symmem_peer_copy_GBs']:.0f} GB/s ({med['symmem_peer_copy_GBs'] / copy_base * 100:.0f}% of one pair's cudaMemcpyPeer) | {copy_base:.0f} GB/s (cudaMemcpyPeer GPU1→GPU0) |",
                  f"| peer data verified | {med['symmem_peer_data_ok']} | |"]
        # The goals: barrier at most 0.8x torch's, rendezvous again at most
        # 2x torch's cached handle.
        b, tb = med["symmem_barrier_us"], med["torch_barrier_us"]
        rv, trv = med["symmem_torch_warm_same_tensor_ms"], med["torch_warm_same_tensor_ms"]
        goal_lines = [
            f"GOAL barrier {b:.2f} us, torch {tb:.2f} us: {b / tb:.3f}x {'OK' if b <= 0.8 * tb else 'MISSED'} (goal <= 0.8x)",
            f"GOAL rendezvous again {rv * 1e3:.2f} us, torch cached {trv * 1e3:.2f} us: {rv / trv:.3f}x "
            f"{'OK' if rv <= 2 * trv else 'MISSED'} (goal <= 2x)",
        ]
        # libsymmem alone: records through the sockets (SYMMEM_SHM_EXCHANGE=0)
        # beside the control page, at one rank per GPU and at the extra world
        # sizes asked for (ranks share GPUs round-robin there).
        lines += ["", "libsymmem alone (gloo for the line-up barriers), medians of the slowest rank:", "",
                  "| ranks on GPUs | records, barrier | group creation, another group (ms) | rendezvous again (µs) | barrier (µs) |",
                  "|---|---|---|---|---|"]
        port = 29700
        for w in sorted(set([world] + [x for x in a.world_sizes if x != world])):
            for mode, flag, barrier in (("page", "1", "linear"), ("sockets", "0", "linear"), ("page", "1", "dissemination")):
                runs = []
                for rep in range(a.reps):
                    port += 1
                    env = {"SYMMEM_SHM_EXCHANGE": flag, "SYMMEM_BARRIER": barrier}
                    if w > n:
                        env["SYMMEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
                    rs = spawn(w, ["gpu", f"bench-only-{os.getpid()}-{w}-{mode}-{rep}", str(port), "only"], tmp, env)
                    runs.append({k: max(r[k] for r in rs) for k in rs[0]})
                m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                lines.append(f"| {w} on {min(w, n)} | {mode}, {barrier} | {m['symmem_group_again_ms']:.2f} | {m['symmem_warm_ms'] * 1e3:.0f} | {m['symmem_barrier_us']:.1f} |")
    text = "\n".join(lines)
    print(text)
    for line in goal_lines:
        print(line)
    with open(os.path.join(a.out, "symm_bench_host.md" if a.host else "symm_bench.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
