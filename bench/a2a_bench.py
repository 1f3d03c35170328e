"""All-to-all on GPUs: libsymmem beside NCCL's all_to_all_single and
torch's all_to_all_vdev / all_to_all_vdev_2d (NVSHMEM backend of torch's
symmetric memory), in the same run, and the MoE dispatch + combine.

    python3 bench/a2a_bench.py --out DIR [--world 2] [--max-mib 256] [--eager-max-kib 1024]
    python3 bench/a2a_bench.py --tables DIR/a2a_bench.json

Rows, for each size from 4 KiB to --max-mib MiB of each rank's input (the
bytes a rank sends, (W-1)/W of them to its peers):

    libsymmem all_to_all     equal splits (Handle.all_to_all, bf16)
    libsymmem all_to_all_v   splits read from the device, moving the same
                             bytes across the links as the equal form: rank
                             r keeps its own share 1/W and sends the rest
                             to the other ranks in proportion to
                             1 + (r + p) % W (equal at 2 ranks)
    torch all_to_all_vdev    equal splits (its kernel needs each split's
                             bytes to divide by its blocks per peer)
    nccl all_to_all_single   equal splits

Timing: every op is captured in a CUDA graph of ITERS calls, replayed REPS
times between CUDA events, ranks lined up before each replay, the replays
of one size round-robin over the implementations (bench/graph_timing.py,
as coll_bench.py); the figure is the slowest rank's median replay divided
by ITERS. Eager rows (--eager-max-kib): EAGER_CALLS uncaptured calls in a
Python loop between CUDA events (symmem.torch's operators, torch's ops,
NCCL), the slowest rank, median of EAGER_REPS.

MoE (--moe-tokens 4096 tokens per rank, --moe-hidden 4096 bf16, top
--moe-topk 4 of --moe-experts 16 experts, random routing): the dispatch of
every token copy to its expert's rank and the combine back, through
libsymmem (symmem.torch.all_to_all_v_2d + all_to_all_v_2d_offset, split
sizes on the GPU), torch's all_to_all_vdev_2d + all_to_all_vdev_2d_offset,
and a dispatch built from NCCL's all_to_all_single, which needs the split
sizes on the host: its time includes exchanging the splits and their
.tolist() (the host synchronisation a real user pays), and not the
permutation into expert order that a user would add. libsymmem and torch
in graphs and eager; NCCL eager only (it cannot be captured).

The peer-copy ceiling (rank 0 copies from GPU 1 into GPU 0 with copy_,
cudaMemcpyPeer) is measured in the same run; BW lines give each large
exchange's received bytes per second against it. GOAL lines judge the
all-to-all goals (libsymmem <= 0.95x the best other at every size, <= 5 us
up to 64 KiB, >= 0.9x peer copy at 64 MiB and up, v within 1.1x of equal,
MoE <= 0.5x torch and faster than NCCL); a missed goal is reported, not a
failure. NVLink multicast is off for everyone (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1, set here, so
in every rank's environment). Writes DIR/a2a_bench.json and, when
matplotlib imports, DIR/a2a_bench.png.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
from bench_common import NO_MULTICAST, environment, latency_plot, peer_copy  # noqa: E402 - multicast off for every process
# torch's NVSHMEM heap holds its inputs, outputs and split tensors, and
# the MoE case's: more than NVSHMEM's 1 GiB default.
os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(4 << 30))

ITERS = 20
REPS = 21
EAGER_CALLS = 50
EAGER_REPS = 7
ROW = 256  # bytes per row of the v forms (128 bf16)

SIZE_IMPLS = ("libsymmem all_to_all", "libsymmem all_to_all_v", "torch all_to_all_vdev", "nccl all_to_all_single")
MOE_IMPLS = ("libsymmem", "torch", "nccl")


def sizes(max_mib, min_kib=4):
    s, out = min_kib << 10, []
    while s <= max_mib << 20:
        out.append(s)
        s *= 4
    return out


def uneven_splits(rows, rank, world):
    """Rank's rows for each peer: its own share rows / W, as with equal
    splits, and the rest spread over the other ranks in proportion to
    1 + (rank + p) % W, so that as many bytes cross the links as with equal
    splits and every rank receives about as many as it sends (at 2 ranks
    there is one other rank: the splits are equal, read from the device)."""
    own = rows // world
    others = [p for p in range(world) if p != rank]
    w = {p: 1 + (rank + p) % world for p in others}
    total = sum(w.values())
    sp = [0] * world
    sp[rank] = own
    for p in others:
        sp[p] = (rows - own) * w[p] // total
    sp[others[-1]] += rows - sum(sp)
    return sp


def kib(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


# --------------------------------------------------------------------------
# One rank
# --------------------------------------------------------------------------


def slowest(torch, dist, dev, values):
    """The largest of every rank's values (the slowest rank), elementwise."""
    t = torch.tensor([v if v is not None else -1.0 for v in values], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [None if v < 0 else v for v in t.tolist()]


def eager_us(torch, dist, dev, fn, calls=EAGER_CALLS):
    """Time per call of fn over calls uncaptured calls on this rank (µs)."""
    dist.barrier()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / calls


def torch_symm(torch, dist, gname, rank):
    """torch's symmetric memory on its NVSHMEM backend, or (None, why)."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        if hasattr(symm_mem, "is_nvshmem_available") and not symm_mem.is_nvshmem_available():
            return None, "NVSHMEM is not available to torch"
        symm_mem.set_backend("NVSHMEM")
        return symm_mem, ""
    except Exception as exc:  # noqa: BLE001 - the torch rows are left out, saying why
        return None, f"{type(exc).__name__}: {exc}"




def size_rows(torch, dist, st, symm_mem, gname, rank, world, dev, max_mib, min_kib, eager_max_kib, only):
    """The rows of every size: graph replays, then eager up to eager_max_kib."""
    from graph_timing import graph_timer, replay_round_robin

    maxb = max_mib << 20
    H = ROW // 2
    s_in = st.empty(maxb // ROW, H, dtype=torch.bfloat16, device=dev).fill_(1)
    hs = st.rendezvous(s_in)  # the graph rows call its Handle directly
    s_out = torch.empty(2 * maxb // ROW, H, dtype=torch.bfloat16, device=dev)  # uneven splits may receive more
    s_oso = torch.empty(2, world, dtype=torch.int64, device=dev)
    n_in = torch.ones(maxb // 2, dtype=torch.bfloat16, device=dev)
    n_out = torch.empty(maxb // 2, dtype=torch.bfloat16, device=dev)
    if symm_mem is not None:
        t_in = symm_mem.empty(maxb // ROW, H, dtype=torch.bfloat16, device=dev).fill_(1)
        t_out = symm_mem.empty(maxb // ROW, H, dtype=torch.bfloat16, device=dev)
        t_sp = symm_mem.empty(world, dtype=torch.int64, device=dev)
        t_oso = symm_mem.empty(2, world, dtype=torch.int64, device=dev)
        for t in (t_in, t_out, t_sp, t_oso):
            symm_mem.rendezvous(t, gname)
    stream = torch.cuda.Stream(device=dev)
    capture, replay_us = graph_timer(torch, dist, stream, ITERS)
    rows, eager = [], []
    sp_tensors = {}
    warm = True
    for size in [sizes(max_mib, min_kib)[0]] + sizes(max_mib, min_kib):
        nrows = size // ROW
        count = size // 2 // world  # bf16 elements per peer
        if size not in sp_tensors:
            sp_tensors[size] = torch.tensor(uneven_splits(nrows, rank, world), dtype=torch.int64, device=dev)
        s_sp = sp_tensors[size]
        cur = lambda: torch.cuda.current_stream(dev).cuda_stream  # noqa: E731
        impls = {
            "libsymmem all_to_all": lambda: hs.all_to_all("bfloat16", count, s_out, cur()),
            # out sized for the call (twice its rows), as a caller sizes it
            # for the most it expects: small calls then take the
            # low-latency path.
            "libsymmem all_to_all_v": lambda: hs.all_to_all_v(ROW, s_sp, s_out, 2 * nrows, s_oso, cur()),
            "nccl all_to_all_single": lambda: dist.all_to_all_single(n_out[: size // 2], n_in[: size // 2]),
        }
        if symm_mem is not None:
            t_sp.fill_(nrows // world)
            impls["torch all_to_all_vdev"] = lambda: torch.ops.symm_mem.all_to_all_vdev(
                t_in[:nrows], t_out, t_sp, t_oso, gname)
        if only:
            impls = {k: f for k, f in impls.items() if any(w in k for w in only.split(","))}
        def report(key, exc, warm=warm):
            if rank == 0 and not warm:
                print(f"{key} {kib(size)}: {type(exc).__name__}: {exc}", flush=True)

        times = replay_round_robin(capture, replay_us, impls, 1 if warm else REPS, report)
        if warm:
            warm = False
            continue
        meds = slowest(torch, dist, dev, [statistics.median(times[k]) if k in times else None for k in SIZE_IMPLS])
        for impl, us in zip(SIZE_IMPLS, meds):
            if impl in impls:
                rows.append({"impl": impl, "bytes": size, "us": us})
                if rank == 0 and us is not None:
                    print(f"graph {impl:26s} {kib(size):>8s} {us:10.2f} us", flush=True)
        if size <= eager_max_kib << 10:
            # symmem.torch's operators, as a user calls them (views made once)
            e_in, e_out = s_in[:nrows], s_out[:nrows]
            e_impls = {
                "libsymmem all_to_all": lambda: st.all_to_all(e_in, out=e_out),
                "libsymmem all_to_all_v": lambda: st.all_to_all_v(s_in, s_out, s_sp, s_oso),
                "nccl all_to_all_single": impls.get("nccl all_to_all_single"),
                "torch all_to_all_vdev": impls.get("torch all_to_all_vdev"),
            }
            e_impls = {k: f for k, f in e_impls.items() if f is not None and k in impls}
            for fn in e_impls.values():
                for _ in range(3):
                    fn()
            ets = {k: [] for k in e_impls}
            for _ in range(EAGER_REPS):
                for k, fn in e_impls.items():
                    ets[k].append(eager_us(torch, dist, dev, fn))
            meds = slowest(torch, dist, dev, [statistics.median(ets[k]) if k in ets else None for k in SIZE_IMPLS])
            for impl, us in zip(SIZE_IMPLS, meds):
                if impl in e_impls:
                    eager.append({"impl": impl, "bytes": size, "us": us})
                    if rank == 0:
                        print(f"eager {impl:26s} {kib(size):>8s} {us:10.2f} us", flush=True)
    return rows, eager


def moe_rows(torch, dist, st, symm_mem, gname, rank, world, dev, tokens, hidden, experts, topk):
    """The MoE dispatch + combine of each implementation (graph and eager
    where it can be captured), the slowest rank."""
    from graph_timing import graph_timer

    if experts % world:
        return {"error": f"{experts} experts do not divide among {world} ranks"}
    S = experts  # world * experts per rank
    copies = tokens * topk
    gen = torch.Generator(device=dev)
    gen.manual_seed(7 + rank)
    choice = torch.rand(tokens, experts, generator=gen, device=dev).topk(topk, dim=1).indices.reshape(-1)
    splits = torch.bincount(choice, minlength=experts).to(torch.int64)
    recv_rows = 2 * copies  # random routing lands about `copies` rows per rank
    s_send = st.empty(copies, hidden, dtype=torch.bfloat16, device=dev).normal_()
    s_recv = st.empty(recv_rows, hidden, dtype=torch.bfloat16, device=dev)
    s_back = torch.empty(copies, hidden, dtype=torch.bfloat16, device=dev)
    s_oso = torch.empty(2, S, dtype=torch.int64, device=dev)
    s_oso2 = torch.empty(2, S, dtype=torch.int64, device=dev)

    def ours():
        st.all_to_all_v_2d(s_send, s_recv, splits, s_oso)
        st.all_to_all_v_2d_offset(s_recv, s_back, s_oso, s_oso2)

    impls = {"libsymmem": ours}
    if symm_mem is not None:
        t_send = symm_mem.empty(copies, hidden, dtype=torch.bfloat16, device=dev).normal_()
        t_recv = symm_mem.empty(recv_rows, hidden, dtype=torch.bfloat16, device=dev)
        t_back = symm_mem.empty(copies, hidden, dtype=torch.bfloat16, device=dev)
        t_sp = symm_mem.empty(S, dtype=torch.int64, device=dev)
        t_sp.copy_(splits)
        t_oso = symm_mem.empty(2, S, dtype=torch.int64, device=dev)
        t_oso2 = symm_mem.empty(2, S, dtype=torch.int64, device=dev)
        for t in (t_send, t_recv, t_back, t_sp, t_oso, t_oso2):
            symm_mem.rendezvous(t, gname)

        def theirs():
            torch.ops.symm_mem.all_to_all_vdev_2d(t_send, t_recv, t_sp, t_oso, gname)
            torch.ops.symm_mem.all_to_all_vdev_2d_offset(t_recv, t_back, t_oso, t_oso2, gname)

        impls["torch"] = theirs
    n_send = torch.randn(copies, hidden, device=dev).to(torch.bfloat16)
    n_recv = torch.empty(recv_rows, hidden, dtype=torch.bfloat16, device=dev)
    n_back = torch.empty(copies, hidden, dtype=torch.bfloat16, device=dev)
    n_splits_in = torch.empty(S, dtype=torch.int64, device=dev)

    def nccl():
        # every rank's per-expert counts for us, then on the host (the sync)
        dist.all_to_all_single(n_splits_in, splits)
        per_in = splits.view(world, -1).sum(dim=1).tolist()
        per_out = n_splits_in.view(world, -1).sum(dim=1).tolist()
        got = sum(per_out)
        dist.all_to_all_single(n_recv[:got], n_send, per_out, per_in)
        dist.all_to_all_single(n_back, n_recv[:got], per_in, per_out)

    impls["nccl"] = nccl
    for fn in impls.values():  # first-use work (rendezvous, NVSHMEM setup) out of the figures
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream(device=dev)
    capture, replay_us = graph_timer(torch, dist, stream, 5)
    graphs, gtimes = {}, {}
    for key in ("libsymmem", "torch"):
        if key in impls:
            try:
                graphs[key] = capture(impls[key])
                gtimes[key] = []
            except Exception as exc:  # noqa: BLE001
                if rank == 0:
                    print(f"moe {key} graph: {type(exc).__name__}: {exc}", flush=True)
    for _ in range(REPS):
        for key, graph in graphs.items():
            gtimes[key].append(replay_us(graph))
    del graphs
    etimes = {k: [] for k in impls}
    for _ in range(EAGER_REPS):
        for key, fn in impls.items():
            etimes[key].append(eager_us(torch, dist, dev, fn, calls=5))
    g = slowest(torch, dist, dev, [statistics.median(gtimes[k]) if k in gtimes else None for k in MOE_IMPLS])
    e = slowest(torch, dist, dev, [statistics.median(etimes[k]) if k in etimes else None for k in MOE_IMPLS])
    ours()
    torch.cuda.synchronize()
    received = slowest(torch, dist, dev, [float(s_oso[0].sum())])[0]
    res = {"tokens": tokens, "hidden": hidden, "experts": experts, "topk": topk, "graph_us": dict(zip(MOE_IMPLS, g)),
           "eager_us": dict(zip(MOE_IMPLS, e)), "most_rows_received": received}
    if rank == 0:
        for impl in MOE_IMPLS:
            print(f"moe dispatch+combine {impl:10s} graph {_fmt(res['graph_us'][impl]):>9s} us  "
                  f"eager {_fmt(res['eager_us'][impl]):>9s} us", flush=True)
    return res


def _fmt(v):
    return "-" if v is None else (f"{v:.2f}" if v < 100 else f"{v:.1f}")




def rank_main(rank, world, port, path, a):
    import torch
    import torch.distributed as dist

    import symmem
    import symmem.torch as st

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=dev)
    gname = dist.group.WORLD.group_name
    symm_mem, why = torch_symm(torch, dist, gname, rank)
    if symm_mem is None and rank == 0:
        print(f"torch's all_to_all_vdev rows left out: {why}", flush=True)
    symmem.collectives_load(rank)
    rows, eager = size_rows(torch, dist, st, symm_mem, gname, rank, world, dev, a.max_mib, a.min_kib,
                            a.eager_max_kib, a.only)
    moe = {} if a.no_moe else moe_rows(torch, dist, st, symm_mem, gname, rank, world, dev, a.moe_tokens,
                                       a.moe_hidden, a.moe_experts, a.moe_topk)
    floor = peer_copy(torch, dist, rank, world, dev, min(a.max_mib, 256) << 20)
    if rank == 0:
        with open(path, "w") as f:
            json.dump({"world": world, "rows": rows, "eager": eager, "moe": moe, "peer_copy": floor,
                       "torch_rows": why or "ok", "env": environment(torch)}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------


def pick(rows, impl, size):
    for r in rows:
        if r["impl"] == impl and r["bytes"] == size:
            return r["us"]
    return None


def tables(res):
    """Markdown tables: graph replays and eager calls per size, µs per call
    (slowest rank), then the MoE case."""
    out = []
    for title, rows in (("graph replay", res["rows"]), ("eager", res.get("eager") or [])):
        if not rows:
            continue
        out += [f"| bytes per rank, {title} | " + " | ".join(SIZE_IMPLS) + " |", "|---|" + "---:|" * len(SIZE_IMPLS)]
        for b in sorted({r["bytes"] for r in rows}):
            out.append(f"| {kib(b)} | " + " | ".join(_fmt(pick(rows, i, b)) for i in SIZE_IMPLS) + " |")
        out.append("")
    moe = res.get("moe") or {}
    if "graph_us" in moe:
        out += [f"| MoE dispatch + combine ({moe['tokens']} tokens, hidden {moe['hidden']} bf16, top-{moe['topk']} of "
                f"{moe['experts']}) | graph µs | eager µs |", "|---|---:|---:|"]
        for impl in MOE_IMPLS:
            out.append(f"| {impl} | {_fmt(moe['graph_us'].get(impl))} | {_fmt(moe['eager_us'].get(impl))} |")
    return "\n".join(out)


def goals(res):
    """GOAL lines, one per goal and size; returns (met, missed)."""
    met = missed = 0
    W = res["world"]

    def line(ok, text):
        nonlocal met, missed
        met, missed = met + bool(ok), missed + (not ok)
        print(f"GOAL {text}  {'OK' if ok else 'MISSED'}", flush=True)

    rows = res["rows"]
    for size in sorted({r["bytes"] for r in rows}):
        ours = pick(rows, "libsymmem all_to_all", size)
        others = [(pick(rows, i, size), i) for i in ("torch all_to_all_vdev", "nccl all_to_all_single")]
        others = [o for o in others if o[0]]
        if ours and others:
            best = min(others)
            line(ours <= 0.95 * best[0], f"{kib(size):>8s} all_to_all {ours:9.2f} us, best other {best[0]:9.2f} us "
                 f"({best[1]}) {ours / best[0]:.3f}x (<= 0.95x)")
        if ours and size <= 64 << 10:
            line(ours <= 5.0, f"{kib(size):>8s} all_to_all {ours:9.2f} us (<= 5 us)")
        v = pick(rows, "libsymmem all_to_all_v", size)
        if ours and v:
            line(v <= 1.1 * ours, f"{kib(size):>8s} all_to_all_v (uneven) {v:9.2f} us, equal {ours:9.2f} us "
                 f"{v / ours:.3f}x (<= 1.1x)")
        floor = res.get("peer_copy")
        if ours and floor and size >= 64 << 20:
            gbps = size * (W - 1) / W / ours / 1e3
            line(gbps >= 0.9 * floor["GBps"], f"{kib(size):>8s} all_to_all receives {gbps:7.1f} GB/s from peers, "
                 f"{gbps / floor['GBps']:.3f}x peer copy {floor['GBps']:.1f} GB/s (>= 0.9x)")
    moe = res.get("moe") or {}
    if "graph_us" in moe:
        ours, torch_us, nccl_us = moe["graph_us"]["libsymmem"], moe["graph_us"]["torch"], moe["eager_us"]["nccl"]
        if ours and torch_us:
            line(ours <= 0.5 * torch_us, f"MoE dispatch+combine {ours:9.1f} us, torch {torch_us:9.1f} us "
                 f"{ours / torch_us:.3f}x (<= 0.5x, graphs)")
        eo = moe["eager_us"]["libsymmem"]
        if eo and nccl_us:
            line(eo < nccl_us, f"MoE dispatch+combine eager {eo:9.1f} us, NCCL all_to_all_single {nccl_us:9.1f} us "
                 f"{eo / nccl_us:.3f}x (< 1x)")
    return met, missed


def plot(res, path):
    panels = []
    for title, rows in (("graph replay", res["rows"]), ("eager", res.get("eager") or [])):
        series = {impl: [(r["bytes"], r["us"]) for r in rows if r["impl"] == impl and r["us"]] for impl in SIZE_IMPLS}
        panels.append((f"all-to-all, {title}, {res['world']} x {res.get('env', {}).get('device', 'GPU')}", series))
    return latency_plot(path, panels, "bytes per rank", "GPU time per call (us), slowest rank")


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/symmem-gpu"))
    ap.add_argument("--world", type=int, default=2, choices=(2, 4, 8), help="ranks, one per GPU")
    ap.add_argument("--max-mib", type=int, default=256, help="largest input per rank")
    ap.add_argument("--min-kib", type=int, default=4)
    ap.add_argument("--eager-max-kib", type=int, default=1024, help="eager rows up to this size (0: none)")
    ap.add_argument("--moe-tokens", type=int, default=4096, help="tokens per rank")
    ap.add_argument("--moe-hidden", type=int, default=4096)
    ap.add_argument("--moe-experts", type=int, default=16)
    ap.add_argument("--moe-topk", type=int, default=4)
    ap.add_argument("--no-moe", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated words: time only the size rows naming one")
    ap.add_argument("--tables", metavar="JSON", help="print the tables and goals of an a2a_bench.json and stop")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    return ap


def main(argv=None):
    """Exit status 0 when every rank ran and the results were written
    (missed goals are GOAL lines, not failures); 1 otherwise."""
    a = parser().parse_args(argv)
    if a.tables:
        with open(a.tables) as f:
            res = json.load(f)
        print(tables(res))
        goals(res)
        return 0
    if a.child:
        rank, world, port, path = a.child
        rank_main(int(rank), int(world), int(port), path, a)
        return 0
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "a2a_bench.json")
    if os.path.exists(path):
        os.remove(path)
    port = 29500 + os.getpid() % 1000
    env = dict(os.environ, SYMMEM_BACKEND="cuda", **NO_MULTICAST)
    fwd = ["--max-mib", str(a.max_mib), "--min-kib", str(a.min_kib), "--eager-max-kib", str(a.eager_max_kib),
           "--moe-tokens", str(a.moe_tokens), "--moe-hidden", str(a.moe_hidden), "--moe-experts",
           str(a.moe_experts), "--moe-topk", str(a.moe_topk), "--only", a.only] + (["--no-moe"] if a.no_moe else [])
    procs = [subprocess.Popen([sys.executable, __file__, *fwd, "--child", str(r), str(a.world), str(port), path],
                              env=env) for r in range(a.world)]
    rc = [p.wait(timeout=1800) for p in procs]
    if any(rc) or not os.path.exists(path):
        print("ranks failed:", rc, "results:", path if os.path.exists(path) else "none", flush=True)
        return 1
    with open(path) as f:
        res = json.load(f)
    print("plot:", plot(res, os.path.join(a.out, "a2a_bench.png")), flush=True)
    print("environment:", json.dumps(res.get("env")), flush=True)
    print(tables(res), flush=True)
    met, missed = goals(res)
    print(f"goals: {met} met, {missed} missed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
