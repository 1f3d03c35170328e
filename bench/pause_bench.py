"""Pause and resume time per GiB on one GPU, with and without backup, beside
the floors measured in the same run:

  create+map   the driver's cuMemCreate + cuMemMap + cuMemSetAccess (and
               cuMemUnmap + cuMemRelease) on the same segment sizes, called
               through ctypes: what a resume without backup cannot beat
               (ours also zeroes the memory, cuMemsetD8)
  D2H / H2D    torch's copy between device memory and pinned host memory: the
               floor of the backup (pause) and of the restore (resume)

torch_memory_saver is not compared: the GPU machine has no network, and its
source package is not there to build (say so in the results).

Run on a GPU machine (scripts/gpu_suite.sh bench does):
    python3 bench/pause_bench.py --gib 4 --reps 5 --out bench-results
Prints a table and writes pause_bench.json under --out.
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("SYMMEM_LIBRARY", os.path.join(ROOT, "build", "libsymmem.so"))
for k, v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ[k] = v

GiB = 1 << 30
SEGMENT = 64 << 20  # every block its own 64 MiB segment, as large tensors are


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


def driver_floor(total, reps):
    """Seconds to create+map+access, and to unmap+release, total bytes in
    SEGMENT pieces (the same calls a resume and a pause make), medians."""
    cu = ctypes.CDLL("libcuda.so.1")
    ull = ctypes.c_ulonglong

    def ok(r, what):
        if r != 0:
            raise RuntimeError(f"{what} failed: CUresult {r}")

    prop = Prop(type=1, requestedHandleTypes=1, locType=1, locId=0)  # pinned, POSIX fd, device 0
    acc = Access(locType=1, locId=0, flags=3)  # read/write
    n = total // SEGMENT
    base = ull()
    ok(cu.cuMemAddressReserve(ctypes.byref(base), ctypes.c_size_t(n * SEGMENT), ctypes.c_size_t(0), ull(0), ull(0)), "cuMemAddressReserve")
    maps, unmaps = [], []
    for _ in range(reps):
        handles = []
        t0 = time.perf_counter()
        for i in range(n):
            h = ull()
            ok(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(SEGMENT), ctypes.byref(prop), ull(0)), "cuMemCreate")
            ok(cu.cuMemMap(ull(base.value + i * SEGMENT), ctypes.c_size_t(SEGMENT), ctypes.c_size_t(0), h, ull(0)), "cuMemMap")
            ok(cu.cuMemSetAccess(ull(base.value + i * SEGMENT), ctypes.c_size_t(SEGMENT), ctypes.byref(acc), ctypes.c_size_t(1)), "cuMemSetAccess")
            handles.append(h)
        maps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for i, h in enumerate(handles):
            ok(cu.cuMemUnmap(ull(base.value + i * SEGMENT), ctypes.c_size_t(SEGMENT)), "cuMemUnmap")
            ok(cu.cuMemRelease(h), "cuMemRelease")
        unmaps.append(time.perf_counter() - t0)
    ok(cu.cuMemAddressFree(base, ctypes.c_size_t(n * SEGMENT)), "cuMemAddressFree")
    return statistics.median(maps), statistics.median(unmaps)


def copy_floor(torch, total, reps):
    """Seconds for D2H and H2D copies of total bytes with pinned host memory."""
    dev = torch.empty(total, dtype=torch.uint8, device="cuda")
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    d2h, h2d = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        host.copy_(dev)
        torch.cuda.synchronize()
        d2h.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        dev.copy_(host)
        torch.cuda.synchronize()
        h2d.append(time.perf_counter() - t0)
    del dev, host
    torch.cuda.empty_cache()
    return statistics.median(d2h), statistics.median(h2d)


def ours(symmem, torch, tag, backup, total, reps):
    """Seconds for symmem.pause and symmem.resume of total bytes in tag."""
    with symmem.region(tag, backup=backup):
        ptrs = [symmem.alloc(SEGMENT) for _ in range(total // SEGMENT)]
    for p in ptrs:
        symmem.memset(p, 1, SEGMENT)
    symmem.pause(tag)  # warm-up: the first pause makes the host buffers
    symmem.resume(tag)
    pauses, resumes = [], []
    free_rise = []
    for _ in range(reps):
        torch.cuda.synchronize()
        f0 = torch.cuda.mem_get_info(0)[0]
        t0 = time.perf_counter()
        symmem.pause(tag)
        pauses.append(time.perf_counter() - t0)
        free_rise.append(torch.cuda.mem_get_info(0)[0] - f0)
        t0 = time.perf_counter()
        symmem.resume(tag)
        resumes.append(time.perf_counter() - t0)
    for p in ptrs:
        symmem.free(p)
    symmem.empty_cache()
    return statistics.median(pauses), statistics.median(resumes), min(free_rise)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=4, help="GiB paused per measurement")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="bench-results")
    a = ap.parse_args()
    import torch

    import symmem

    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the primary context is current on this thread
    total = a.gib * GiB
    name = torch.cuda.get_device_name(0)
    res = {"device": name, "gib": a.gib, "reps": a.reps, "segment_bytes": SEGMENT}
    res["create_map_s"], res["unmap_release_s"] = driver_floor(total, a.reps)
    res["d2h_s"], res["h2d_s"] = copy_floor(torch, total, a.reps)
    for backup in (True, False):
        tag = "bench-backup" if backup else "bench-nobackup"
        p, r, rise = ours(symmem, torch, tag, backup, total, a.reps)
        res[f"pause_s/{tag}"], res[f"resume_s/{tag}"], res[f"free_rise/{tag}"] = p, r, rise
    res["torch_memory_saver"] = "not measured: no network on the GPU machine and no source package to build it from"
    per = lambda s: s / a.gib * 1e3  # noqa: E731  ms per GiB
    print(f"device {name}; {a.gib} GiB in {SEGMENT >> 20} MiB segments; medians of {a.reps} reps; ms per GiB")
    rows = [
        ("pause, backup (ours)", res["pause_s/bench-backup"]),
        ("  floor: D2H pinned copy + unmap/release", res["d2h_s"] + res["unmap_release_s"]),
        ("resume, backup (ours)", res["resume_s/bench-backup"]),
        ("  floor: create+map+access + H2D pinned copy", res["create_map_s"] + res["h2d_s"]),
        ("pause, no backup (ours)", res["pause_s/bench-nobackup"]),
        ("  floor: unmap/release", res["unmap_release_s"]),
        ("resume, no backup (ours, includes zeroing)", res["resume_s/bench-nobackup"]),
        ("  floor: create+map+access", res["create_map_s"]),
        ("D2H pinned copy (torch)", res["d2h_s"]),
        ("H2D pinned copy (torch)", res["h2d_s"]),
    ]
    for label, s in rows:
        print(f"  {label:48s} {per(s):9.2f}")
    print(f"  free memory rose by {res['free_rise/bench-backup'] / GiB:.2f} / {res['free_rise/bench-nobackup'] / GiB:.2f} GiB while paused (backup / no backup)")
    print("  torch_memory_saver: " + res["torch_memory_saver"])
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "pause_bench.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
