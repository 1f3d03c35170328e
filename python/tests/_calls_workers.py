"""Rank functions for test_calls.py (run by _mp.run_ranks): the per-call
paths (Note [The call module] in symmem/_lib.py) and symmem.torch's
rendezvous again (Note [Rendezvous again] in symmem/torch.py), on the host
backend.
"""

from __future__ import annotations

import time
from typing import Dict


def barrier_signal_collective(rank: int, world: int, name: str, hide_module: bool) -> Dict:
    """A barrier, a signal each way and an all-reduce through whichever
    call table the environment gives; which one it was. hide_module: the
    call module cannot be imported here, as where it was never built."""
    import struct
    import sys

    if hide_module:
        sys.modules["symmem._calls"] = None  # import symmem._calls raises ImportError
    import symmem
    from symmem import _lib

    res = {"extension": _lib.calls().extension, "reason": _lib.calls_fallback_reason}
    with symmem.Group(name, rank, world, timeout=60) as g:
        buf = symmem.empty(64)
        with symmem.rendezvous(buf, g) as h:
            mv = buf.memoryview()
            mv[:16] = struct.pack("4i", rank + 1, rank + 2, rank + 3, rank + 4)
            h.barrier()
            # Signals on channel 1: the barriers' own signals are channel 0's.
            h.put_signal((rank + 1) % world, channel=1)
            h.wait_signal((rank - 1) % world, channel=1, timeout=30)
            h.all_reduce("int32", count=4)
            res["sum"] = list(struct.unpack("4i", bytes(mv[:16])))
            try:
                h.wait_signal((rank - 1) % world, channel=1, timeout=0.2)
                res["timeout"] = None
            except symmem.TimeoutError as exc:
                res["timeout"] = str(exc)
            h.barrier()
            del mv
        buf.free()
    return res


def rendezvous_again(rank: int, world: int, init_file: str) -> Dict:
    """Rank 0 rendezvouses again on a tensor (alone: no exchange may be
    needed), releases handles in turn, and the shared handle lives until
    the last one goes."""
    import torch
    import torch.distributed as dist

    import symmem.torch as st

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    res: Dict = {}
    t = st.empty(256)
    h1 = st.rendezvous(t)
    if rank == 0:
        t0 = time.perf_counter()
        h2 = st.rendezvous(t)  # rank 1 does not: an exchange would wait for it (60 s)
        res["again_s"] = time.perf_counter() - t0
        res["same_handle"] = h2.handle is h1.handle
        h2.release()
        h2.release()  # a second release of one handle does nothing more
        res["alive_after_one_release"] = h1.handle._ptr is not None
    dist.barrier()
    h1.barrier(timeout=30)  # still usable on both ranks
    h1.release()
    res["released_with_the_last"] = h1.handle._ptr is None
    # After the last release a rendezvous is an exchange again, on every rank.
    h3 = st.rendezvous(t)
    res["fresh_after_release"] = h3.handle is not h1.handle
    h3.barrier(timeout=30)
    h3.release()
    # By the process group object and by its name: the lease of the default
    # group's rendezvous, found without an exchange.
    h4 = st.rendezvous(t)
    h5 = st.rendezvous(t, dist.group.WORLD)
    h6 = st.rendezvous(t, dist.group.WORLD.group_name)
    res["again_by_group"] = h5.handle is h4.handle and h6.handle is h4.handle
    for h in (h6, h5):
        h.release()
    # destroy_group ends the leases: the next rendezvous is an exchange on
    # a new symmem Group, and the handle held before is released.
    st.destroy_group()
    h7 = st.rendezvous(t)
    res["fresh_after_destroy_group"] = h7.handle is not h4.handle and h4.handle._ptr is None
    h7.barrier(timeout=30)
    h7.release()
    dist.barrier()
    dist.destroy_process_group()
    return res
