"""Rank functions of test_copy_engine.py: the copy-engine collectives
(algo "copy_engine", sm_free=True) through symmem.Handle, on either backend."""

from __future__ import annotations

import struct
from typing import Dict

import symmem
from _workers import TIMEOUT, _coll_inputs, device_of, outcomes


def copy_engine(rank: int, world: int, name: str, count: int) -> Dict:
    """Every collective on the copy engines, in place and out of place,
    int32 and float32; what each read back, and the errors of sm_free
    arguments that contradict themselves."""
    dev = device_of(rank)
    out: Dict = {}
    with symmem.Group(name, rank, world, device=dev, timeout=TIMEOUT) as g:
        nbytes = (count * 4 * world * 2 + 255) // 256 * 256
        with symmem.empty(nbytes, dev) as buf, symmem.empty(nbytes, dev) as local:
            with symmem.rendezvous(buf, g) as h:

                def put(fmt, n=count):
                    buf.write(struct.pack(f"<{n}{fmt}", *_coll_inputs(rank, n, fmt)))

                def get(b, n, fmt, offset=0):
                    return list(struct.unpack(f"<{n}{fmt}", b.read(offset, 4 * n)))

                put("i")
                h.all_reduce("int32", count=count, algo="copy_engine")
                out["sum_inplace"] = get(buf, count, "i")
                put("i")
                h.all_reduce("int32", "max", count=count, out=local, sm_free=True)
                out["max_local"] = get(local, count, "i")
                put("f")
                h.all_reduce("float32", count=count, out=buf.ptr + nbytes // 2, sm_free=True, algo="auto")
                out["fsum_block"] = get(buf, count, "f", nbytes // 2)
                put("f")
                h.all_reduce("float32", "min", count=count, out=local, algo="copy-engine")
                out["fmin_local"] = get(local, count, "f")
                put("i")
                h.all_gather("int32", count=count, out=local, sm_free=True)
                out["gather"] = get(local, world * count, "i")
                per = count - count % world
                put("i", per)
                h.reduce_scatter("int32", count=per, out=local, sm_free=True)
                out["scatter"] = get(local, per // world, "i")
                put("f", per)
                h.reduce_scatter("float32", "max", count=per, out=local, algo="copy_engine")
                out["fscatter_max"] = get(local, per // world, "f")
                put("i", per)
                h.all_to_all("int32", count=per // world, out=local, sm_free=True)
                out["a2a"] = get(local, per, "i")
                out["errors"] = outcomes((
                    ("contradiction", lambda: h.all_gather("int32", count=4, out=local, algo="one_shot", sm_free=True)),
                    ("not_bool", lambda: h.all_reduce("int32", count=4, sm_free="yes")),
                ))
                out["device_error"] = h.device_error()
    return out


def leave_sms(rank: int, world: int, name: str) -> Dict:
    """Under SYMMEM_LEAVE_SMS=1 (the ranks' environment): an auto
    all-reduce is the copy engines'; the last rank asks for one_shot, so
    every rank gets MISMATCH naming both calls. Then auto on every rank
    runs and sums."""
    dev = device_of(rank)
    out: Dict = {}
    with symmem.Group(name, rank, world, device=dev, timeout=TIMEOUT) as g:
        with symmem.empty(4096, dev) as buf, symmem.rendezvous(buf, g) as h:
            buf.write(struct.pack("<4i", *([rank + 1] * 4)))
            try:
                h.all_reduce("int32", count=4, algo="one_shot" if rank == world - 1 else None)
                out["mismatch"] = None
            except symmem.SymmemError as exc:
                out["mismatch"] = (type(exc).__name__, int(exc.code), str(exc))
            h.all_reduce("int32", count=4)
            out["sum"] = list(struct.unpack("<4i", buf.read(0, 16)))
    return out
