"""Collectives on a group that spans machines: libsymmem's all_reduce /
all_gather / reduce_scatter (symmem.torch, on a ProcessGroupNCCL: the local
team's kernels inside a machine, NCCL between machines) beside NCCL's own
collectives (torch.distributed) on the same sizes, bf16, 4 KiB to 256 MiB,
in one run; libsymmem's all_reduce also with algo "hierarchical" and "nccl"
forced (where they cross is SYMMEM_HIER_MIN_BYTES, docs/machines.md). NCCL
runs on plain tensors and on window-registered ones
(libsymmem's tensors, whose segments every rendezvous registers as NCCL
symmetric windows; and torch's NCCL MemPool with symmetric registration
where this torch has it).

On real nodes, one process per GPU:

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:PORT \\
        bench/multihost_bench.py [--max-mib 256] [--out result.json]

On one host, imitating machines (each rank gets SYMMEM_MACHINE_ID, a
socket directory and NCCL_HOSTID of its machine, so that NCCL, like
libsymmem, sees one host per imitated machine: P2P and SHM inside one, its
network transport between them, as between nodes; --transport network
forces the network everywhere with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1):

    python3 bench/multihost_bench.py --imitate 2x4        # 2 machines of 4 ranks

NCCL refuses two ranks on one GPU, so the imitation needs a GPU per rank.
--smoke runs on one GPU shared by 2 ranks (SYMMEM_ALLOW_OVERLAPPING_DEVICES=1)
over a gloo process group and checks results only: libsymmem's collectives
against references on one imitated machine, and, on two imitated machines
without an NCCL communicator, that rendezvous works and the collectives are
refused as UNAVAILABLE (no engine between machines) or give right results.

Timing (as bench/coll_bench.py): every call is captured in a CUDA graph of
ITERS calls, replayed REPS times between CUDA events with the ranks lined up
before each replay; the replays of one size go round-robin over the
implementations; a rank's figure is its median replay / ITERS: GPU time per
call. The table shows every rank's figure; bus bandwidth (as nccl-tests:
all_reduce size*2*(W-1)/W/t, the others size*(W-1)/W/t) uses the slowest
rank. Sizes: all_reduce and reduce_scatter the bytes of each rank's input,
all_gather the bytes of the output. Before timing, every implementation's
result at every size is checked against a reference. NVLink multicast is off
for everyone (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# NCCL between imitated machines of one host takes its network transport.
NETWORK_ONLY = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
COLLS = ("all_reduce", "all_gather", "reduce_scatter")


# ---------------------------------------------------------------------------
# Pure parts (no torch): arguments, layouts, environments, the table.
# python/tests/test_multihost_bench.py tests them.
# ---------------------------------------------------------------------------


def parse_layout(text):
    """'2x4' -> (2 machines, 4 ranks each)."""
    try:
        machines, per = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"layout {text!r} is not MACHINESxRANKS (e.g. 2x4)") from None
    if machines < 1 or per < 1:
        raise argparse.ArgumentTypeError(f"layout {text!r}: machines and ranks per machine are >= 1")
    return machines, per


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-kib", type=int, default=4, help="smallest size (KiB), default 4")
    ap.add_argument("--max-mib", type=int, default=256, help="largest size (MiB), default 256")
    ap.add_argument("--iters", type=int, default=20, help="calls per CUDA graph")
    ap.add_argument("--reps", type=int, default=11, help="timed replays per implementation and size")
    ap.add_argument("--colls", default=",".join(COLLS), help="comma-separated subset of " + ",".join(COLLS))
    ap.add_argument("--impls", default="", help="comma-separated implementations to run (names as in the table; default every one)")
    ap.add_argument("--imitate", type=parse_layout, metavar="MxR",
                    help="launch M imitated machines of R ranks on this host (one GPU per rank)")
    ap.add_argument("--gpus", type=int, default=0, help="GPUs to use when imitating (default: all visible)")
    ap.add_argument("--transport", choices=("hostid", "network"), default="hostid",
                    help="NCCL between imitated machines: one NCCL_HOSTID per machine (P2P and SHM inside "
                         "each, the default) or the network transport everywhere")
    ap.add_argument("--smoke", action="store_true", help="2 ranks on one GPU, gloo, results checked, nothing timed")
    ap.add_argument("--out", help="write every rank's figures as JSON here")
    args = ap.parse_args(argv)
    colls = [c for c in args.colls.split(",") if c]
    bad = [c for c in colls if c not in COLLS]
    if bad:
        ap.error(f"--colls: unknown {', '.join(bad)} (known: {', '.join(COLLS)})")
    args.colls = colls
    if args.min_kib < 1 or args.max_mib < 1 or (args.min_kib << 10) > (args.max_mib << 20):
        ap.error("--min-kib and --max-mib must be >= 1 with min <= max")
    if args.iters < 1 or args.reps < 1:
        ap.error("--iters and --reps must be >= 1")
    return args


def sizes(min_kib, max_mib):
    """Byte sizes from min_kib KiB to max_mib MiB, by factors of 4."""
    s, out = min_kib << 10, []
    while s <= max_mib << 20:
        out.append(s)
        s *= 4
    return out


def bus_factor(coll, world):
    return 2 * (world - 1) / world if coll == "all_reduce" else (world - 1) / world


def rank_env(rank, layout, base, socket_root, port, gpus, smoke=False, transport="hostid"):
    """The environment of rank `rank` of an imitated layout (machines, per):
    its machine's identity and socket directory, the torchrun variables,
    the device it runs on, NCCL's network transport between the imitated
    machines, and never NVLink multicast."""
    machines, per = layout
    world = machines * per
    machine, local = divmod(rank, per)
    env = dict(base)
    env.update(NO_MULTICAST)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(per),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "SYMMEM_MACHINE_ID": f"imitated-machine-{machine}",
        "SYMMEM_SOCKET_DIR": os.path.join(socket_root, f"machine-{machine}"),
        "MULTIHOST_BENCH_DEVICE": str(rank % max(gpus, 1)),
    })
    if not smoke:
        env["NCCL_HOSTID"] = f"imitated-machine-{machine}"
        if transport == "network":
            env.update(NETWORK_ONLY)
    if world > gpus:
        env["SYMMEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    return env


def human(n):
    for unit, s in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << s:
            return f"{n / (1 << s):g} {unit}"
    return f"{n} B"


def format_table(per_rank, world):
    """One table from every rank's rows ({"coll", "impl", "bytes", "us"}, us
    None where the implementation failed): a line per (coll, size, impl)
    with every rank's GPU time per call, and the bus bandwidth of the
    slowest rank."""
    keys, seen = [], set()
    for rows in per_rank:
        for r in rows:
            k = (r["coll"], r["bytes"], r["impl"])
            if k not in seen:
                seen.add(k)
                keys.append(k)
    keys.sort(key=lambda k: (COLLS.index(k[0]) if k[0] in COLLS else 99, k[1]))
    at = [{(r["coll"], r["bytes"], r["impl"]): r["us"] for r in rows} for rows in per_rank]
    impl_w = max([len(k[2]) for k in keys] + [14])
    head = f"{'collective':15s} {'size':>9s} {'implementation':{impl_w}s}" + "".join(
        f" {'rank ' + str(r) + ' us':>11s}" for r in range(len(per_rank))) + f" {'busbw GB/s':>11s}"
    lines = [head, "-" * len(head)]
    for coll, size, impl in keys:
        figs = [a.get((coll, size, impl)) for a in at]
        cells = "".join(f" {f:11.2f}" if f is not None else f" {'-':>11s}" for f in figs)
        done = [f for f in figs if f is not None]
        bw = f"{size * bus_factor(coll, world) / max(done) / 1e3:11.1f}" if len(done) == len(figs) and done else f"{'-':>11s}"
        lines.append(f"{coll:15s} {human(size):>9s} {impl:{impl_w}s}{cells} {bw}")
    return "\n".join(lines)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------
# The launcher (imitated machines on this host)
# ---------------------------------------------------------------------------


def launch(args, argv):
    gpus = args.gpus
    if args.smoke:
        layouts = [((1, 2), 1), ((2, 1), 1)]  # one machine of 2 ranks; two machines of 1; one GPU
    else:
        if not gpus:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
            gpus = len([l for l in out.stdout.splitlines() if l.startswith("GPU ")])
        layouts = [(args.imitate, gpus)]
    rc = 0
    for layout, ngpus in layouts:
        machines, per = layout
        world = machines * per
        if not args.smoke and world > ngpus:
            print(f"multihost_bench: {machines}x{per} needs {world} GPUs ({ngpus} found): NCCL refuses two ranks on one GPU",
                  file=sys.stderr)
            return 2
        port = free_port()
        with tempfile.TemporaryDirectory(prefix="symmem-multihost-") as tmp:
            for m in range(machines):
                os.makedirs(os.path.join(tmp, f"machine-{m}"), mode=0o700)
            done = os.path.join(tmp, "done")
            os.makedirs(done)
            procs = []
            for r in range(world):
                env = rank_env(r, layout, os.environ, tmp, port, ngpus, smoke=args.smoke, transport=args.transport)
                env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
                env["MULTIHOST_BENCH_DONE"] = done
                procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv, env=env))
            rc |= wait_ranks(procs, done)
    return rc


EXIT_GRACE_S = 60


def wait_ranks(procs, done):
    """Waits for the rank processes; the status of the run. A rank writes
    its status into done/rank-R once its figures are reported (Note
    [Teardown across imitated machines]); ranks still running
    EXIT_GRACE_S seconds after every rank has done so are ended (SIGKILL),
    and their reported status counts."""
    all_done_at = None
    while any(p.poll() is None for p in procs):
        if all_done_at is None and len(os.listdir(done)) == len(procs):
            all_done_at = time.monotonic()
        if all_done_at is not None and time.monotonic() - all_done_at > EXIT_GRACE_S:
            stuck = [r for r, p in enumerate(procs) if p.poll() is None]
            print(f"multihost_bench: ranks {stuck} had reported and had not exited {EXIT_GRACE_S} s later "
                  "(torch's NCCL shutdown); ended", file=sys.stderr, flush=True)
            for r in stuck:
                procs[r].kill()
                procs[r].wait()
            break
        time.sleep(0.2)
    rc = 0
    for r, p in enumerate(procs):
        reported = os.path.join(done, f"rank-{r}")
        if p.returncode is not None and p.returncode >= 0:
            rc |= p.returncode
        elif os.path.exists(reported):
            with open(reported) as f:
                rc |= int(f.read().strip() or 1)
        else:
            rc |= 1
    return rc


# ---------------------------------------------------------------------------
# A rank
# ---------------------------------------------------------------------------


def rank_main(args):
    import torch
    import torch.distributed as dist

    import symmem
    import symmem.torch as st

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev_index = int(os.environ.get("MULTIHOST_BENCH_DEVICE", os.environ.get("LOCAL_RANK", "0")))
    dev = torch.device("cuda", dev_index)
    torch.cuda.set_device(dev)
    if args.smoke:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        try:
            return smoke(args, torch, dist, symmem, st, rank, world, dev)
        finally:
            dist.destroy_process_group()
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    pg = dist.group.WORLD
    g = st.group_for(pg, device=dev_index)
    local = (getattr(g, "local_rank", None), getattr(g, "local_size", None))
    if rank == 0:
        print(f"multihost_bench: {world} ranks, NCCL {torch.cuda.nccl.version()}, libsymmem {symmem.__version__}, "
              f"device {torch.cuda.get_device_name(dev)}", flush=True)
    print(f"rank {rank}: machine {os.environ.get('SYMMEM_MACHINE_ID', socket.gethostname())}, "
          f"local rank {local[0]} of {local[1]}, device {dev_index}", flush=True)

    maxb = args.max_mib << 20
    bf16 = torch.bfloat16
    # libsymmem's tensors (their segments are NCCL windows after the
    # rendezvous), NCCL's plain tensors, and torch's NCCL MemPool ones.
    ours_in = st.empty(maxb // 2, dtype=bf16, device=dev)
    ours_out = st.empty(maxb // 2, dtype=bf16, device=dev)
    st.rendezvous(ours_in, pg)
    st.rendezvous(ours_out, pg)
    plain_in = torch.empty(maxb // 2, dtype=bf16, device=dev)
    plain_out = torch.empty(maxb // 2, dtype=bf16, device=dev)
    pool_in = pool_out = None
    try:
        pool_in, pool_out = nccl_pool_tensors(torch, dist, pg, maxb, dev)
    except Exception as exc:  # noqa: BLE001 - reported; the other rows still run
        if rank == 0:
            print(f"nccl (torch MemPool window): not run: {type(exc).__name__}: {exc}", flush=True)

    stream = torch.cuda.Stream(device=dev)
    iters, reps = args.iters, args.reps

    def impls_for(coll, n):
        """name -> (call, input tensor, output tensor) for n bf16 elements
        (each rank's input for all_reduce/reduce_scatter, the output for
        all_gather)."""
        sets = {"libsymmem": (ours_in, ours_out), "nccl (plain)": (plain_in, plain_out),
                "nccl (libsymmem window)": (ours_in, ours_out)}
        if pool_in is not None:
            sets["nccl (torch MemPool window)"] = (pool_in, pool_out)
        out = {}
        for name, (a, b) in sets.items():
            ours = name == "libsymmem"
            if coll == "all_reduce":
                x = a[:n]
                call = (lambda x=x: st.all_reduce(x, "sum", pg)) if ours else (lambda x=x: dist.all_reduce(x))
                out[name] = (call, x, x)
                if ours:
                    # Both forms across machines, whatever auto picks
                    # (docs/machines.md: SYMMEM_HIER_MIN_BYTES is where they cross).
                    for algo in ("hierarchical", "nccl"):
                        out[f"libsymmem {algo}"] = ((lambda x=x, algo=algo: st.all_reduce(x, "sum", pg, algo=algo)), x, x)
            elif coll == "all_gather":
                x, y = a[: n // world], b[:n]
                call = (lambda x=x, y=y: st.all_gather(x, pg, out=y)) if ours else (
                    lambda x=x, y=y: dist.all_gather_into_tensor(y, x))
                out[name] = (call, x, y)
            else:
                x, y = a[:n], b[: n // world]
                call = (lambda x=x, y=y: st.reduce_scatter(x, "sum", pg, out=y)) if ours else (
                    lambda x=x, y=y: dist.reduce_scatter_tensor(y, x))
                out[name] = (call, x, y)
        return out

    from graph_timing import graph_timer

    capture, replay_us = graph_timer(torch, dist, stream, iters)

    rows, failures = [], []
    all_sizes = sizes(args.min_kib, args.max_mib)
    warmed = False  # the very first size runs once more, untimed: clocks and first-use work settle
    for coll in args.colls:
        for size in ([] if warmed else [all_sizes[0]]) + all_sizes:
            warm, warmed = not warmed, True
            n = size // 2
            if n % world:
                continue
            impls = impls_for(coll, n)
            if args.impls:
                impls = {k: v for k, v in impls.items() if k in args.impls.split(",")}
            for name, (call, x, y) in impls.items():
                err = check_one(torch, coll, call, x, y, rank, world)
                if err:
                    failures.append(f"{coll} {name} {size}: {err}")
            graphs, times = {}, {}
            for name, (call, _, _) in impls.items():
                try:
                    graphs[name] = capture(call)
                    times[name] = []
                except Exception as exc:  # noqa: BLE001 - reported; the others still run
                    failures.append(f"{coll} {name} {size}: capture: {type(exc).__name__}: {exc}")
            for _ in range(1 if warm else reps):
                for name, graph in graphs.items():
                    times[name].append(replay_us(graph))
            del graphs
            if warm:
                continue
            for name in impls:
                us = statistics.median(times[name]) if times.get(name) else None
                rows.append({"coll": coll, "impl": name, "bytes": size, "us": us})
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rows": rows, "failures": failures, "local": local,
                                      "machine": os.environ.get("SYMMEM_MACHINE_ID", socket.gethostname())})
    if rank == 0:
        print(format_table([g["rows"] for g in gathered], world), flush=True)
        for r, g in enumerate(gathered):
            for f in g["failures"]:
                print(f"rank {r}: FAILED {f}", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"world": world, "ranks": gathered, "device": torch.cuda.get_device_name(dev),
                           "nccl": ".".join(map(str, torch.cuda.nccl.version()))}, f, indent=1)
    bad = any(g["failures"] for g in gathered)
    # Note [Teardown across imitated machines]
    #
    # libsymmem's part of the group goes first (symmem.torch.destroy_group),
    # then torch's. Across imitated machines (NCCL_HOSTID apart, so NCCL
    # runs its socket transport between them), torch's NCCL shutdown after
    # CUDA-graph-captured NCCL calls (destroy_process_group) did not return
    # on any rank on 4 x H200, also when the only implementation timed was
    # plain NCCL. So a rank of an imitated run reports its status to the
    # launcher, and once every rank has passed the barrier (every call has
    # finished) it ends its process without torch's shutdown (os._exit:
    # the driver and the OS release what it holds); the launcher also ends
    # ranks that have not exited a minute after every rank has reported
    # (wait_ranks). Under torchrun the shutdown is torch's.
    rc = 1 if bad else 0
    done = os.environ.get("MULTIHOST_BENCH_DONE")
    if done:
        with open(os.path.join(done, f"rank-{rank}"), "w") as f:
            f.write(str(rc))
    st.destroy_group(pg)
    dist.barrier()
    if done:
        torch.cuda.synchronize(dev)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    dist.destroy_process_group()
    return rc


def nccl_pool_tensors(torch, dist, pg, maxb, dev):
    """Two bf16 tensors of maxb/2 elements from torch's NCCL MemPool
    (ncclMemAlloc), registered with the communicator as symmetric windows
    (MemPool(symmetric=True) and register_mem_pool), where this torch has
    them."""
    import inspect

    backend = pg._get_backend(dev)
    params = inspect.signature(torch.cuda.MemPool).parameters
    kw = {"symmetric": True} if "symmetric" in params else ({"symm_mem": True} if "symm_mem" in params else None)
    if kw is None:
        raise RuntimeError("torch.cuda.MemPool has no symmetric registration in this torch")
    pool = torch.cuda.MemPool(backend.mem_allocator, **kw)
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(maxb // 2, dtype=torch.bfloat16, device=dev)
        b = torch.empty(maxb // 2, dtype=torch.bfloat16, device=dev)
    backend.register_mem_pool(pool)
    nccl_pool_tensors.pool = pool  # kept alive with the tensors
    return a, b


def input_values(coll, index, rank):
    """Element values (integers, exact in bf16 in every partial sum up to
    248 ranks): for the reductions rank 0 gives index % 7 + 1 and rank r > 0
    gives 1 + r % 2, so the positions and the number of ranks summed show;
    for all_gather rank r gives index % 7 + 1 + 8 * (r % 16). Works on ints
    and on torch tensors alike."""
    if coll == "all_gather":
        return index % 7 + 1 + 8 * (rank % 16)
    return index % 7 + 1 if rank == 0 else index * 0 + 1 + rank % 2


def expected_values(coll, index, rank, world, n_out):
    """Element `index` of the output of coll on rank `rank` (n_out elements)."""
    if coll == "all_gather":
        per = n_out // world
        return input_values(coll, index % per, index // per)
    g = index + rank * n_out if coll == "reduce_scatter" else index
    return g % 7 + 1 + sum(1 + r % 2 for r in range(1, world))


def fill_inputs(torch, coll, x, rank, world):
    i = torch.arange(x.numel(), device=x.device)
    x.copy_(input_values(coll, i, rank).to(x.dtype))


def reference(torch, coll, n_out, rank, world, device):
    i = torch.arange(n_out, device=device)
    return expected_values(coll, i, rank, world, n_out).to(torch.bfloat16)


def check_one(torch, coll, call, x, y, rank, world):
    """Runs call once on known inputs; None when y holds the reference,
    else what differs."""
    try:
        fill_inputs(torch, coll, x, rank, world)
        if y is not x:
            y.fill_(-7)
        torch.cuda.synchronize()
        call()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - reported
        return f"{type(exc).__name__}: {exc}"
    want = reference(torch, coll, y.numel(), rank, world, y.device)
    bad = (y != want).nonzero()
    if bad.numel():
        k = int(bad[0][0])
        return f"{bad.shape[0]} of {y.numel()} elements differ (first: element {k} is {float(y[k])}, want {float(want[k])})"
    return None


def smoke(args, torch, dist, symmem, st, rank, world, dev):
    """2 ranks on one GPU over gloo: results only (see the module doc)."""
    machine = os.environ.get("SYMMEM_MACHINE_ID", "")
    pg = dist.group.WORLD
    g = st.group_for(pg, device=dev.index)
    local_size = getattr(g, "local_size", None)
    machines = [None] * world
    dist.all_gather_object(machines, machine)
    one_machine = len(set(machines)) == 1
    n = 3 * 4096 * world
    x = st.empty(n, dtype=torch.bfloat16, device=dev)
    y = st.empty(n, dtype=torch.bfloat16, device=dev)
    failures = []
    if local_size is not None and local_size != machines.count(machine):
        failures.append(f"local_size is {local_size}, {machines.count(machine)} ranks share machine {machine!r}")
    for coll in args.colls:
        if coll == "all_reduce":
            call, a, b = (lambda: st.all_reduce(x, "sum", pg)), x, x
        elif coll == "all_gather":
            xs, ys = x[: n // world], y[:n]
            call, a, b = (lambda: st.all_gather(xs, pg, out=ys)), xs, ys
        else:
            ys = y[: n // world]
            call, a, b = (lambda: st.reduce_scatter(x, "sum", pg, out=ys)), x, ys
        err = check_one(torch, coll, call, a, b, rank, world)
        if one_machine:
            if err:
                failures.append(f"{coll} on one machine: {err}")
        elif err and "[UNAVAILABLE]" not in err:
            # Across machines without an NCCL communicator the library has
            # no engine between machines: UNAVAILABLE, or right results.
            failures.append(f"{coll} across machines without NCCL: {err}")
        print(f"rank {rank} ({machine}, {'one machine' if one_machine else 'machines ' + ','.join(machines)}): "
              f"{coll}: {'ok' if not err else err}", flush=True)
    for f in failures:
        print(f"rank {rank}: FAILED {f}", flush=True)
    dist.barrier()
    return 1 if failures else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    os.environ.update(NO_MULTICAST)
    if "RANK" in os.environ:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        return rank_main(args)
    if args.smoke or args.imitate:
        return launch(args, argv)
    print("multihost_bench: run under torchrun (RANK set), or with --imitate MxR or --smoke on one host", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
