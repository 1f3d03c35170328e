"""Rank functions of the tensor-parallel tests without torch
(test_tensor_parallel.py): symmem.Handle.all_reduce_rmsnorm over ctypes
buffers."""

from __future__ import annotations

import struct
from typing import Dict, List

import symmem
from _tp_ref import from_bits, to_bits
from _workers import TIMEOUT, device_of, outcomes

FMT = {"float32": ("I", 4), "bfloat16": ("H", 2), "float16": ("H", 2)}


def values(dtype: str, kind: int, rank: int, n: int, call: int) -> List[float]:
    """n values of dtype: kind 0 the input, 1 the residual, 2 the weight."""
    out = []
    for i in range(n):
        if kind == 2:
            f = 0.5 + ((i * 37 + call) % 97) / 64
        else:
            f = ((rank * 7919 + i * 131 + call * 17 + kind * 1009) % 2003 - 1001) * 0.0123
        out.append(from_bits(dtype, to_bits(dtype, f)))
    return out


def _write(buf, offset: int, dtype: str, vals) -> None:
    fmt, _ = FMT[dtype]
    buf.write(struct.pack(f"<{len(vals)}{fmt}", *[to_bits(dtype, v) for v in vals]), offset)


def _read(buf, offset: int, dtype: str, n: int) -> List[int]:
    fmt, size = FMT[dtype]
    return list(struct.unpack(f"<{n}{fmt}", buf.read(offset, n * size)))


def all_reduce_rmsnorm(rank: int, world: int, name: str, cases) -> Dict:
    """Runs each (dtype, tokens, hidden, algo, where, eps) of cases as call
    number i; returns for each the residual and out bits read back, then the
    errors of bad calls as (type name, code, message)."""
    dev = device_of(rank)
    results = []
    errors = {}
    nbytes = 1 << 18
    with symmem.Group(name, rank, world, device=dev, timeout=TIMEOUT) as g:
        with symmem.empty(nbytes, dev) as buf, symmem.empty(nbytes, dev) as res, \
                symmem.empty(nbytes, dev) as wt, symmem.empty(nbytes, dev) as local:
            with symmem.rendezvous(buf, g) as h:
                for call, (dtype, tokens, hidden, algo, where, eps) in enumerate(cases):
                    n = tokens * hidden
                    _write(buf, 0, dtype, values(dtype, 0, rank, n, call))
                    _write(res, 0, dtype, values(dtype, 1, 0, n, call))  # replicated, as in a TP layer
                    _write(wt, 0, dtype, values(dtype, 2, rank, hidden, call))
                    out, at = None, (buf, 0)
                    if where == "local":
                        out, at = local, (local, 0)
                    elif where == "block":
                        out, at = buf.ptr + nbytes // 2, (buf, nbytes // 2)
                    h.all_reduce_rmsnorm(dtype, tokens, hidden, res, wt, eps, out=out, algo=algo)
                    results.append((_read(res, 0, dtype, n), _read(at[0], at[1], dtype, n)))
                errors = outcomes((
                    ("int32", lambda: h.all_reduce_rmsnorm("int32", 1, 8, res, wt, 1e-6)),
                    ("hidden", lambda: h.all_reduce_rmsnorm("bfloat16", 1, 12, res, wt, 1e-6)),
                    ("eps", lambda: h.all_reduce_rmsnorm("bfloat16", 1, 8, res, wt, float("nan"))),
                    ("eps_type", lambda: h.all_reduce_rmsnorm("bfloat16", 1, 8, res, wt, "1e-6")),
                    ("overlap", lambda: h.all_reduce_rmsnorm("bfloat16", 4, 8, res, res.ptr + 16, 1e-6)),
                    ("tokens", lambda: h.all_reduce_rmsnorm("bfloat16", -1, 8, res, wt, 1e-6)),
                    ("algo", lambda: h.all_reduce_rmsnorm("bfloat16", 1, 8, res, wt, 1e-6, algo="fastest")),
                ), also=(TypeError,))
                device_error = h.device_error()
    return {"results": results, "errors": errors, "device_error": device_error}
