"""Pause and resume side by side: libsymmem (through its torch_memory_saver
drop-in, symmem.compat) and torch_memory_saver in both hook modes
("preload": LD_PRELOAD of its hook library; "torch": its pluggable
allocator), each measurement in a fresh process, the processes interleaved
(round r runs every implementation once before round r+1 starts).

Workloads (--workloads):
  4g-1      4 GiB in one tensor
  4g-1024   4 GiB in 1024 tensors of 4 MiB
  model     --model-gib GiB (default 24) of weights in 4 and 12 MiB tensors (with
            CPU backup) and a CUDA graph captured on a second tag ("graph",
            no backup) that reads them; both tags paused and resumed, the
            graph replayed after the resume and checked against its output
            before the first pause
4g-* run with and without CPU backup (--backup). Per process: the first
pause (host memory not yet pinned for torch_memory_saver; libsymmem pins
its copy in the background from the allocation on, and the workload then
runs --settle seconds of GPU work before the first pause, the same for
every implementation), later pauses and resumes (medians of --reps), and
the floor measured in the same process before the workload: one
device-to-host and one host-to-device copy of the same bytes with pinned
host memory (torch's copy_). Without backup, "resume, libsymmem's
zero-fill" is libsymmem's own symmem.resume (which zero-fills memory
without a copy; the drop-in, like torch_memory_saver, does not).

Host memory (the process's resident set, /proc/self/status, less what it
was before the workload; pinned memory counts there): "host while live" just
before the first pause (libsymmem's copies pinned ahead), "host peak"
(VmHWM, reset after the floor's copies) over all the cycles, and "host
after resume" after the last resume. "symmem" runs with libsymmem's
defaults (pinned copies held between cycles within SYMMEM_BACKUP_PIN_AHEAD);
"symmem-pin0" with SYMMEM_BACKUP_PIN_AHEAD=0 (nothing held between cycles,
as torch_memory_saver).

torch_memory_saver is skipped, saying why, when it cannot be imported. The
driver floor (cuMemCreate+cuMemMap+cuMemSetAccess and cuMemUnmap+cuMemRelease
through ctypes, with and without a POSIX-fd handle type) is one more process.

Run on one GPU (an 80 GB H100 is enough; each command stays under 10 min):
    python3 bench/pause_bench.py --workloads 4g-1,4g-1024 --rounds 2 --out bench-results
    python3 bench/pause_bench.py --workloads model --out bench-results
Prints one table (every process's figure, then the median) and writes
pause_bench-<workloads>.json under --out.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 1 << 30
MiB = 1 << 20
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
IMPLS = ("symmem", "symmem-pin0", "tms-preload", "tms-torch")


# --------------------------------------------------------------------------
# The child: one implementation, one workload, one process
# --------------------------------------------------------------------------


def _saver(impl):
    if impl.startswith("symmem"):
        from symmem.compat.torch_memory_saver import torch_memory_saver

        return torch_memory_saver
    from torch_memory_saver import torch_memory_saver

    torch_memory_saver.hook_mode = impl.split("-", 1)[1]
    return torch_memory_saver


def _timed(torch, f):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    f()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def copy_floor(torch, nbytes, reps):
    """Seconds of one D2H and one H2D copy of nbytes with pinned host memory
    (the pinning itself is not timed), medians of reps."""
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    d2h = [_timed(torch, lambda: host.copy_(dev)) for _ in range(reps)]
    h2d = [_timed(torch, lambda: dev.copy_(host)) for _ in range(reps)]
    del dev, host
    torch.cuda.empty_cache()
    if hasattr(torch._C, "_host_emptyCache"):
        torch._C._host_emptyCache()  # give the floor's pinned memory back
    return statistics.median(d2h), statistics.median(h2d)


def host_bytes(key="VmRSS"):
    """The process's resident memory (VmRSS) or its peak (VmHWM), bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_host_peak():
    """Start VmHWM again from the current resident set (Linux: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def settle(torch, seconds):
    """GPU work for about seconds (a model's other work before its first pause)."""
    if seconds <= 0:
        return
    a = torch.randn(4096, 4096, device="cuda")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a = torch.tanh(a @ a * 1e-4)
        torch.cuda.synchronize()
    del a


def child(impl, workload, backup, reps, settle_s, model_gib):
    for k, v in SAFE_ENV.items():
        os.environ[k] = v
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    tms = _saver(impl)
    out = {"impl": impl, "workload": workload, "backup": backup, "device": torch.cuda.get_device_name(0)}
    if workload == "model":
        # Pairs of 4 MiB (five to a 20 MiB segment of torch's caching
        # allocator) and 12 MiB (a segment of its own): a few thousand tensors.
        sizes = [4 * MiB, 12 * MiB] * (model_gib * GiB // (16 * MiB))
    elif workload == "4g-1":
        sizes = [4 * GiB]
    else:
        sizes = [4 * MiB] * 1024
    total = sum(sizes)
    out["bytes"], out["tensors"] = total, len(sizes)
    out["floor_d2h_s"], out["floor_h2d_s"] = copy_floor(torch, total, 3)
    peak_reset = reset_host_peak()
    host0 = host_bytes()

    tags = ["weights"]
    with tms.region(tag="weights", enable_cpu_backup=backup):
        ts = [torch.empty(n // 4, dtype=torch.float32, device="cuda") for n in sizes]
    for i, t in enumerate(ts):
        t.fill_(float(i % 251))
    graph = None
    if workload == "model":
        # A graph over the paused weights, its memory in tag "graph" (the
        # torch hook mode cannot make a graph pauseable: torch's own pool).
        xs = ts[:64]
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            sum(x.sum() for x in xs)
        torch.cuda.current_stream().wait_stream(s)
        graph_ctx = torch.cuda.graph(g) if impl == "tms-torch" else tms.cuda_graph(g, tag="graph")
        with graph_ctx:
            gout = sum(x.sum() for x in xs)
        g.replay()
        torch.cuda.synchronize()
        ref = gout.item()
        graph = (g, gout, ref)
        if impl != "tms-torch":
            tags.append("graph")
        out["graph_pauseable"] = impl != "tms-torch"
    torch.cuda.synchronize()
    settle(torch, settle_s)

    def pause():
        for t in tags:
            tms.pause(t)

    def resume():
        for t in reversed(tags):
            tms.resume(t)

    out["host_live_gib"] = (host_bytes() - host0) / GiB
    f0 = torch.cuda.mem_get_info(0)[0]
    out["first_pause_s"] = _timed(torch, pause)
    out["free_rise_gib"] = (torch.cuda.mem_get_info(0)[0] - f0) / GiB
    out["first_resume_s"] = _timed(torch, resume)
    pauses, resumes = [], []
    for _ in range(reps):
        pauses.append(_timed(torch, pause))
        resumes.append(_timed(torch, resume))
    out["pause_s"], out["resume_s"] = statistics.median(pauses), statistics.median(resumes)
    out["host_resumed_gib"] = (host_bytes() - host0) / GiB
    if peak_reset:
        out["host_peak_gib"] = (host_bytes("VmHWM") - host0) / GiB
    if backup:
        probe = list(range(0, len(ts), max(1, len(ts) // 16)))
        out["contents_ok"] = all(float(ts[i][-1].item()) == float(i % 251) for i in probe)
    if graph is not None:
        g, gout, ref = graph
        g.replay()
        torch.cuda.synchronize()
        out["graph_replay_ok"] = abs(gout.item() - ref) <= 1e-3 * max(1.0, abs(ref))
    if impl == "symmem" and not backup:
        import symmem

        zero = []
        for _ in range(reps):
            symmem.pause("tms.weights")
            zero.append(_timed(torch, lambda: symmem.resume("tms.weights")))
        out["resume_zero_s"] = statistics.median(zero)
    print("RESULT " + json.dumps(out), flush=True)


def driver_child(reps):
    """The driver's own create+map+access and unmap+release of 4 GiB in one
    allocation and in 205 of 20 MiB, with handle type none and POSIX fd."""
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the primary context is current on this thread
    cu = ctypes.CDLL("libcuda.so.1")
    ull = ctypes.c_ulonglong

    class Prop(ctypes.Structure):  # CUmemAllocationProp (checked by cuda/abicheck)
        _fields_ = [
            ("type", ctypes.c_int),
            ("requestedHandleTypes", ctypes.c_int),
            ("locType", ctypes.c_int),
            ("locId", ctypes.c_int),
            ("win32HandleMetaData", ctypes.c_void_p),
            ("compressionType", ctypes.c_ubyte),
            ("gpuDirectRDMACapable", ctypes.c_ubyte),
            ("usage", ctypes.c_ushort),
            ("reserved", ctypes.c_ubyte * 4),
        ]

    class Access(ctypes.Structure):  # CUmemAccessDesc
        _fields_ = [("locType", ctypes.c_int), ("locId", ctypes.c_int), ("flags", ctypes.c_int)]

    def ok(r, what):
        if r != 0:
            raise RuntimeError(f"{what} failed: CUresult {r}")

    # Read-write access for device 0 alone, and (where there is a second
    # GPU) for device 0 and its peer, as a mapping that peers may read gets.
    ndev = torch.cuda.device_count()
    accs = {"": (Access * 1)(Access(locType=1, locId=0, flags=3))}
    if ndev > 1:
        accs["+peer"] = (Access * 2)(Access(locType=1, locId=0, flags=3), Access(locType=1, locId=1, flags=3))
    out = {"impl": "driver", "device": torch.cuda.get_device_name(0)}
    cases = [(h, seg, n, "") for h in (0, 1) for seg, n in ((4 * GiB, 1), (20 * MiB, 205))]
    cases += [(1, seg, n, "+peer") for seg, n in ((4 * GiB, 1), (20 * MiB, 205)) if "+peer" in accs]
    for handle, seg, n, peers in cases:
        prop = Prop(type=1, requestedHandleTypes=handle, locType=1, locId=0)
        acc = accs[peers]
        base = ull()
        ok(cu.cuMemAddressReserve(ctypes.byref(base), ctypes.c_size_t(n * seg), ctypes.c_size_t(0), ull(0), ull(0)), "cuMemAddressReserve")
        maps, unmaps = [], []
        for _ in range(reps):
            hs = []
            t0 = time.perf_counter()
            for i in range(n):
                h = ull()
                ok(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(seg), ctypes.byref(prop), ull(0)), "cuMemCreate")
                ok(cu.cuMemMap(ull(base.value + i * seg), ctypes.c_size_t(seg), ctypes.c_size_t(0), h, ull(0)), "cuMemMap")
                ok(cu.cuMemSetAccess(ull(base.value + i * seg), ctypes.c_size_t(seg), acc, ctypes.c_size_t(len(acc))), "cuMemSetAccess")
                hs.append(h)
            maps.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for i, h in enumerate(hs):
                ok(cu.cuMemUnmap(ull(base.value + i * seg), ctypes.c_size_t(seg)), "cuMemUnmap")
                ok(cu.cuMemRelease(h), "cuMemRelease")
            unmaps.append(time.perf_counter() - t0)
        ok(cu.cuMemAddressFree(base, ctypes.c_size_t(n * seg)), "cuMemAddressFree")
        key = f"{'posix' if handle else 'none'}/{n}x{seg >> 20}MiB{peers}"
        out[f"create_map_s/{key}"] = statistics.median(maps)
        out[f"unmap_release_s/{key}"] = statistics.median(unmaps)
    print("RESULT " + json.dumps(out), flush=True)


# --------------------------------------------------------------------------
# The parent: fresh interleaved processes, one table
# --------------------------------------------------------------------------


def without_dropin(env):
    """env whose PYTHONPATH keeps every entry but libsymmem's own (its
    package and the drop-in's shim): the real torch_memory_saver, never the
    drop-in, wherever it was installed."""
    env = dict(env)
    keep = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and not os.path.abspath(p).startswith(ROOT) and "symmem" not in os.path.basename(p.rstrip(os.sep))]
    if keep:
        env["PYTHONPATH"] = os.pathsep.join(keep)
    else:
        env.pop("PYTHONPATH", None)
    return env


def tms_status():
    """(LD_PRELOAD value for the preload mode, None) or (None, why not)."""
    env = without_dropin(os.environ)
    code = (
        "import os, torch_memory_saver as t\n"
        "with t.configure_subprocess():\n"
        "    print('PRELOAD ' + os.environ['LD_PRELOAD'])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    lines = [l for l in r.stdout.splitlines() if l.startswith("PRELOAD ")]
    if r.returncode != 0 or not lines:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"torch_memory_saver cannot be imported: {last}"
    return lines[-1][len("PRELOAD ") :], None


def run_child(args, env, timeout=600):
    r = subprocess.run([sys.executable, os.path.abspath(__file__)] + args, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        tail = (r.stderr.strip().splitlines() or r.stdout.strip().splitlines() or ["?"])[-3:]
        return {"error": f"exit {r.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1][len("RESULT ") :])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--workloads", default="4g-1,4g-1024,model")
    ap.add_argument("--backup", default="both", choices=["both", "yes", "no"], help="CPU backup for the 4g-* workloads")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3, help="later pauses and resumes per process")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds of GPU work between allocation and first pause")
    ap.add_argument("--model-gib", type=int, default=24)
    ap.add_argument("--no-driver-floor", action="store_true")
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--child", nargs=3, metavar=("IMPL", "WORKLOAD", "BACKUP"), help=argparse.SUPPRESS)
    ap.add_argument("--driver-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        impl, workload, backup = a.child
        child(impl, workload, backup == "1", a.reps, a.settle, a.model_gib)
        return
    if a.driver_child:
        driver_child(a.reps)
        return

    base_env = dict(os.environ)
    base_env.update(SAFE_ENV)
    base_env.setdefault("SYMMEM_LIBRARY", os.path.join(ROOT, "build", "libsymmem.so"))
    sym_env = dict(base_env)
    sym_env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python")] + [p for p in [base_env.get("PYTHONPATH")] if p])
    tms_env = without_dropin(base_env)
    impls = [i for i in a.impls.split(",") if i]
    preload, why = (None, None)
    if any(i.startswith("tms") for i in impls):
        preload, why = tms_status()
        if why:
            print(f"skipping torch_memory_saver: {why}", flush=True)
            impls = [i for i in impls if not i.startswith("tms")]
    cases = []
    for w in a.workloads.split(","):
        backups = [True] if w == "model" else {"both": [True, False], "yes": [True], "no": [False]}[a.backup]
        cases += [(w, b) for b in backups]
    results = []
    if not impls:
        print("nothing to measure", flush=True)
        return
    if not a.no_driver_floor:
        r = run_child(["--driver-child", "--reps", str(a.reps)], sym_env)
        results.append(r)
    for rnd in range(a.rounds):
        for w, b in cases:
            order = impls[rnd % len(impls):] + impls[: rnd % len(impls)]  # interleaved, rotating who goes first
            for impl in order:
                env = dict(sym_env) if impl.startswith("symmem") else dict(tms_env)
                if impl == "symmem-pin0":
                    env["SYMMEM_BACKUP_PIN_AHEAD"] = "0"
                if impl == "tms-preload":
                    env["LD_PRELOAD"] = preload
                args = ["--child", impl, w, "1" if b else "0", "--reps", str(a.reps), "--settle", str(a.settle), "--model-gib", str(a.model_gib)]
                t0 = time.perf_counter()
                r = run_child(args, env)
                r.setdefault("impl", impl)
                r.setdefault("workload", w)
                r.setdefault("backup", b)
                r["round"] = rnd
                results.append(r)
                print(f"  round {rnd} {impl:12s} {w:8s} backup={int(b)}: {time.perf_counter() - t0:5.1f} s {r.get('error', '')}", flush=True)
    print_table(results, a, why)
    os.makedirs(a.out, exist_ok=True)
    name = "pause_bench-" + a.workloads.replace(",", "+") + ".json"
    with open(os.path.join(a.out, name), "w") as f:
        json.dump({"args": vars(a), "tms_skipped": why, "results": results}, f, indent=1)


def print_table(results, a, why):
    devices = sorted({r["device"] for r in results if "device" in r})
    print(f"\npause_bench: {', '.join(devices)}; settle {a.settle} s; later pause/resume: medians of {a.reps}; ms per process (median)")
    if why:
        print(f"torch_memory_saver: not measured ({why})")
    metrics = [
        ("first pause", "first_pause_s"),
        ("later pause", "pause_s"),
        ("first resume", "first_resume_s"),
        ("resume", "resume_s"),
        ("resume, libsymmem's zero-fill", "resume_zero_s"),
        ("floor: D2H pinned copy", "floor_d2h_s"),
        ("floor: H2D pinned copy", "floor_h2d_s"),
    ]
    host_metrics = [
        ("host while live (GiB)", "host_live_gib"),
        ("host peak (GiB)", "host_peak_gib"),
        ("host after resume (GiB)", "host_resumed_gib"),
    ]
    groups = {}
    for r in results:
        if r.get("impl") == "driver":
            continue
        groups.setdefault((r["workload"], r["backup"]), []).append(r)
    for (w, b), rs in groups.items():
        n = rs[0].get("tensors", "?")
        gib = rs[0].get("bytes", 0) / GiB
        print(f"\n{w}: {gib:.0f} GiB in {n} tensors, CPU backup {'yes' if b else 'no'}")
        impls = []
        for r in rs:
            if r["impl"] not in impls:
                impls.append(r["impl"])
        print(f"  {'':24s}" + "".join(f"{i:>28s}" for i in impls))
        for label, key in metrics:
            cells, any_value = [], False
            for i in impls:
                vals = [r[key] for r in rs if r["impl"] == i and key in r]
                if vals:
                    any_value = True
                    each = "/".join(f"{v * 1e3:.1f}" for v in vals)
                    cells.append(f"{each} ({statistics.median(vals) * 1e3:.1f})" if len(vals) > 1 else each)
                else:
                    cells.append("-")
            if any_value:
                print(f"  {label:24s}" + "".join(f"{c:>28s}" for c in cells))
        for label, key in host_metrics:
            cells = []
            for i in impls:
                vals = [r[key] for r in rs if r["impl"] == i and key in r]
                cells.append("/".join(f"{v:.2f}" for v in vals) if vals else "-")
            if any(c != "-" for c in cells):
                print(f"  {label:24s}" + "".join(f"{c:>28s}" for c in cells))
        notes = []
        for r in rs:
            if "error" in r:
                notes.append(f"{r['impl']} round {r['round']}: FAILED {r['error']}")
            if r.get("contents_ok") is False:
                notes.append(f"{r['impl']} round {r['round']}: contents NOT restored")
            if "graph_replay_ok" in r:
                notes.append(f"{r['impl']} round {r['round']}: graph replay {'ok' if r['graph_replay_ok'] else 'WRONG'}"
                             + ("" if r.get("graph_pauseable", True) else " (graph memory not pauseable in this mode)"))
            if "free_rise_gib" in r:
                notes.append(f"{r['impl']} round {r['round']}: free memory +{r['free_rise_gib']:.2f} GiB while paused")
        for s in notes:
            print("  " + s)
    for r in results:
        if r.get("impl") == "driver":
            if "error" in r:
                print(f"\ndriver floor: FAILED {r['error']}")
                continue
            print("\ndriver floor (ms): create+map+access / unmap+release")
            for k in sorted(k for k in r if k.startswith("create_map_s/")):
                sub = k.split("/", 1)[1]
                print(f"  {sub:24s} {r[k] * 1e3:9.2f} / {r['unmap_release_s/' + sub] * 1e3:9.2f}")


if __name__ == "__main__":
    main()
