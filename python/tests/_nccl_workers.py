"""Rank functions for test_nccl_host.py: groups over the NCCL stand-in
(cuda/testdata/fakenccl.c), whose communicators a rank makes with ctypes as
a C program would with NCCL."""

from __future__ import annotations

import ctypes
import os
from typing import Dict

import symmem
from _workers import _pattern

TIMEOUT = 20.0


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def make_comm(rank: int, world: int, job: str):
    nccl = ctypes.CDLL(os.environ["SYMMEM_LIBNCCL"])
    uid = UniqueId()
    uid.internal = f"fakenccl-{job}".encode()
    comm = ctypes.c_void_p()
    rc = nccl.ncclCommInitRank(ctypes.byref(comm), world, uid, rank)
    assert rc == 0, f"ncclCommInitRank: {rc}"
    return nccl, comm.value


def group_over_comm(rank: int, world: int, job: str) -> Dict:
    nccl, comm = make_comm(rank, world, job)
    info: Dict = {"version": symmem.nccl_version()}
    g = symmem.Group.from_nccl(comm, f"{job}-g", timeout=TIMEOUT)
    info["group"] = (g.rank, g.world_size, g.device)
    nbytes = 3 << 20
    buf = symmem.empty(nbytes, g.device)
    buf.fill(0)
    h = symmem.rendezvous(buf, g)
    info["window"] = h.nccl_window
    h2 = symmem.rendezvous(buf, g)
    info["same_window"] = h2.nccl_window == info["window"]
    info["counts_after_two"] = g.nccl_window_counts()
    h.barrier(timeout=TIMEOUT)
    chunk = nbytes // world
    for peer in range(world):
        h.get_buffer(peer).write(_pattern(rank, peer, chunk), rank * chunk)
    h.barrier(timeout=TIMEOUT)
    own = buf.read(0, nbytes)
    info["slots_ok"] = [own[w * chunk : (w + 1) * chunk] == _pattern(w, rank, chunk) for w in range(world)]
    h.barrier(timeout=TIMEOUT)
    h.release()
    h2.release()
    buf.free()
    symmem.empty_cache(g.device)
    info["counts_after_release"] = g.nccl_window_counts()
    with symmem.Group.from_nccl(comm, f"{job}-nowin", timeout=TIMEOUT, windows=False) as nw:
        with symmem.empty(1 << 20, nw.device) as b2:
            with symmem.rendezvous(b2, nw) as hn:
                info["nowin_window"] = hn.nccl_window
        info["nowin_counts"] = nw.nccl_window_counts()
    g.destroy()
    nccl.ncclCommDestroy(ctypes.c_void_p(comm))
    return info


def mismatch(rank: int, world: int, job: str) -> Dict:
    nccl, comm = make_comm(rank, world, job)
    with symmem.Group.from_nccl(comm, f"{job}-g", timeout=TIMEOUT) as g:
        with symmem.empty((1 + rank) << 20, g.device) as buf:
            try:
                symmem.rendezvous(buf, g)
            except symmem.SymmemError as exc:
                return {"code": int(exc.code), "msg": str(exc), "counts": g.nccl_window_counts()}
    return {"code": 0}


def unavailable(rank: int, world: int, what: str) -> Dict:
    try:
        symmem.nccl_version()
    except symmem.SymmemError as exc:
        return {"code": int(exc.code), "msg": str(exc)}
    return {"code": 0}
