"""Rank functions for the collective pause tests (host backend in CI, two
GPUs in the GPU suite). Data moves with Buffer.read/write, which work on
both backends."""

from __future__ import annotations

import os
from typing import Dict

import symmem
from _workers import TIMEOUT, device_of


def _pattern(writer: int, reader: int, n: int) -> bytes:
    """n bytes that say who wrote them for whom (cheap at 32 MiB)."""
    seed = (writer * 131 + reader * 7 + 1) & 0xFF
    period = bytes((seed + i) & 0xFF for i in range(256))
    return (period * (n // 256 + 1))[:n]


def rss_shmem() -> int:
    """This process's resident shared memory in bytes (/proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssShmem in /proc/self/status")


def free_device_memory(dev: int) -> int:
    """Free memory of the device as the driver reports it (cuda only)."""
    import torch

    return torch.cuda.mem_get_info(dev)[0]


def collective_pause(rank: int, world: int, name: str, nbytes: int, cycles: int) -> Dict:
    """Every rank allocates a tagged buffer (with backup), rendezvouses, and
    writes every peer; then cycles of a collective pause (measuring the
    footprint), resume, a check that every rank's data came back at the same
    pointers, and every rank writing every peer again."""
    dev = device_of(rank)
    tag = f"tag-{name}"
    out: Dict = {"drops": [], "same_ptrs": [], "data_ok": [], "paused_bytes": []}
    # A real GPU: free device memory as the driver reports it; the host
    # backend and the fake driver (memfd memory): the process's RssShmem.
    cuda = symmem.backend_name() == "cuda" and "fake" not in os.environ.get("SYMMEM_LIBCUDA", "")
    with symmem.Group(name, rank, world, device=dev, timeout=TIMEOUT) as g:
        with symmem.region(tag, backup=True):
            buf = symmem.empty(nbytes, dev)
        with buf, symmem.rendezvous(buf.ptr, g) as h:
            ptrs = list(h.buffer_ptrs)
            chunk = nbytes // world
            for cycle in range(cycles):
                for peer in range(world):
                    h.get_buffer(peer).write(_pattern(rank, (peer + cycle) % 251, chunk), rank * chunk)
                h.barrier(timeout=TIMEOUT)
                if cuda:
                    import torch

                    torch.cuda.synchronize(dev)
                    before = free_device_memory(dev)
                else:
                    # Every page of every rank's segment resident here.
                    for peer in range(world):
                        h.get_buffer(peer).read(0, nbytes)
                    before = rss_shmem()
                symmem.pause(tag, group=g)
                out["paused_bytes"].append(symmem.memory_stats(dev)["paused_bytes.all.current"])
                after = free_device_memory(dev) if cuda else rss_shmem()
                out["drops"].append(after - before if cuda else before - after)
                symmem.resume(tag, group=g)
                out["same_ptrs"].append(list(h.buffer_ptrs) == ptrs)
                own = buf.read(0, nbytes)
                out["data_ok"].append(
                    all(own[w * chunk : (w + 1) * chunk] == _pattern(w, (rank + cycle) % 251, chunk) for w in range(world))
                )
                h.barrier(timeout=TIMEOUT)
            # And once more after the last cycle: every rank writes every peer.
            for peer in range(world):
                h.get_buffer(peer).write(_pattern(rank, peer, chunk), rank * chunk)
            h.barrier(timeout=TIMEOUT)
            own = buf.read(0, nbytes)
            out["final_ok"] = all(own[w * chunk : (w + 1) * chunk] == _pattern(w, rank, chunk) for w in range(world))
            h.barrier(timeout=TIMEOUT)
    out["pid"] = os.getpid()
    return out


def pause_when_a_peer_leaves(rank: int, world: int, name: str, victim: int) -> Dict:
    """The victim leaves the group (its channel closes, as when a process
    dies: the Go tests kill the process itself) instead of pausing; the
    others get an error naming it, and their tag is still live (allocations
    in it work)."""
    dev = device_of(rank)
    tag = f"tag-{name}"
    with symmem.Group(name, rank, world, device=dev, timeout=5.0) as g:
        with symmem.region(tag):
            buf = symmem.empty(4096, dev)
        with buf, symmem.rendezvous(buf.ptr, g) as h:
            h.barrier(timeout=TIMEOUT)
            if rank == victim:
                g.destroy()
                return {"code": -1, "message": "left"}
            try:
                symmem.pause(tag, group=g)
            except symmem.SymmemError as exc:
                with symmem.region(tag):
                    p = symmem.alloc(100, dev)
                symmem.free(p)
                return {"code": int(exc.code), "message": str(exc)}
    return {"code": 0, "message": "pause succeeded without the victim"}
