"""A plain-Python reference of the all-reduce with RMSNorm (include/symmem.h,
"All-reduce with RMSNorm"; docs/tensor-parallel.md, "Rounding"), written
from the documented rounding, bit for bit: every fp32 operation is a double
operation rounded to fp32 (exact for +, *, / and sqrt: double has more than
twice fp32's precision plus two bits), every rounding to the dtype to nearest
even."""

from __future__ import annotations

import math
import struct
from typing import List, Sequence, Tuple

PARTS = 256


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def to_bits(dtype: str, x: float) -> int:
    """x (an fp32 value) rounded to dtype, as its bits."""
    if dtype == "float32":
        return struct.unpack("<I", struct.pack("<f", x))[0]
    if dtype == "float16":
        return struct.unpack("<H", struct.pack("<e", x))[0]
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    if (b & 0x7FFFFFFF) > 0x7F800000:
        return (b >> 16) | 0x40
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def from_bits(dtype: str, b: int) -> float:
    if dtype == "float32":
        return struct.unpack("<f", struct.pack("<I", b))[0]
    if dtype == "float16":
        return struct.unpack("<e", struct.pack("<H", b))[0]
    return struct.unpack("<f", struct.pack("<I", b << 16))[0]


def rnd(dtype: str, x: float) -> float:
    return from_bits(dtype, to_bits(dtype, x))


def reference(dtype: str, xs: Sequence[Sequence[float]], residual: Sequence[float], weight: Sequence[float],
              hidden: int, eps: float) -> Tuple[List[int], List[int]]:
    """(residual bits, out bits) of one rank: xs is every rank's input in
    rank order, residual and weight this rank's, all values of dtype."""
    eps = f32(eps)
    tokens = len(residual) // hidden
    res_bits: List[int] = []
    out_bits: List[int] = []
    for t in range(tokens):
        row = range(t * hidden, (t + 1) * hidden)
        res = []
        for k in row:
            acc = xs[0][k]
            for x in xs[1:]:
                acc = f32(acc + x[k])
            res.append(rnd(dtype, f32(rnd(dtype, acc) + residual[k])))
        parts = [0.0] * PARTS
        for i, v in enumerate(res):
            parts[(i // 8) % PARTS] = f32(parts[(i // 8) % PARTS] + f32(v * v))
        s = PARTS // 2
        while s >= 1:
            for j in range(s):
                parts[j] = f32(parts[j] + parts[j + s])
            s //= 2
        inv = f32(1.0 / f32(math.sqrt(f32(f32(parts[0] / hidden) + eps))))
        for i, v in enumerate(res):
            res_bits.append(to_bits(dtype, v))
            out_bits.append(to_bits(dtype, f32(f32(v * inv) * weight[i])))
    return res_bits, out_bits
