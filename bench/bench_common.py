"""What the GPU benchmarks share: NVLink multicast off for every process
they start, the pairwise peer-copy floor of a run, the environment the
figures were taken on, and the latency plots. Imported by the bench scripts (bench/ is their
first sys.path entry)."""
import os
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NO_MULTICAST)


def size_label(n):
    """n bytes as the tables write them: 4 KiB, 16 MiB, 100 B."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def peer_copy(torch, dist, rank, world, dev, nbytes):
    """The pairwise peer-copy floor (GB/s, one direction): rank 0 copies
    nbytes from a buffer on GPU 1 into its own with copy_ (cudaMemcpyPeer),
    median of 5 after a warm-up; None on one GPU. Collective (a barrier)."""
    result = None
    if rank == 0 and world > 1 and torch.cuda.device_count() > 1:
        src = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", 1)).fill_(1)
        dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        dst.copy_(src)
        torch.cuda.synchronize()
        ts = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        result = {"bytes": nbytes, "GBps": nbytes / statistics.median(ts) / 1e9}
        print(f"peer copy (GPU 1 -> GPU 0, {size_label(nbytes)}): {result['GBps']:.1f} GB/s", flush=True)
        del src, dst
    dist.barrier()
    return result


def environment(torch):
    """What the figures were taken on: commit, device, driver, versions."""
    def run(*cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=ROOT).stdout.strip()
        except Exception:  # noqa: BLE001 - a field left empty
            return ""

    import symmem

    nccl = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else None
    return {
        "commit": os.environ.get("BENCH_COMMIT") or run("git", "rev-parse", "--short", "HEAD") or "unknown",
        "device": torch.cuda.get_device_name(0),
        "devices": torch.cuda.device_count(),
        "driver": run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").splitlines()[:1],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
        "libsymmem": getattr(symmem, "__version__", "?"),
    }


def latency_plot(path, panels, xlabel, ylabel):
    """Time per call against size on log-log axes, one panel per (title,
    {label: [(bytes, us), ...]}) of panels side by side, saved to path.
    Returns path, or why there is no plot (matplotlib missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        return f"no plot: {exc}"
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    for ax, (title, series) in zip(axes[0], panels):
        for label, pts in series.items():
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        if any(series.values()):
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
