"""The tensor-parallel operators' arguments and shapes, without torch
(symmem.torch.fused_all_gather_matmul, fused_matmul_reduce_scatter and
all_reduce_rmsnorm check with these, and so do their fake implementations
under torch.compile; CI tests them where torch is not installed).

Shapes are tuples of ints. Every refusal is a ValueError naming the
operator, the argument and what it needed, as torch's own operators refuse
(torch.distributed._symmetric_memory)."""

from __future__ import annotations

from typing import List, Sequence, Tuple

Shape = Tuple[int, ...]

AG = "symmem.torch.fused_all_gather_matmul"
RS = "symmem.torch.fused_matmul_reduce_scatter"
NORM = "symmem.torch.all_reduce_rmsnorm"
REDUCE_OPS = ("sum", "avg")
NORM_MAX_HIDDEN = 16384


def _dim(what: str, name: str, dim, ndim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{what}: {name} must be an int, not {type(dim).__name__}")
    if dim < 0 or dim >= ndim:
        raise ValueError(f"{what}: {name} {dim} is not a dimension of the input (0 .. {ndim - 1})")
    return dim


def all_gather_matmul_shapes(a_shard: Shape, bs: Sequence[Shape], gather_dim: int,
                             world: int) -> Tuple[Shape, List[Shape]]:
    """(the gathered A's shape, each A @ B's shape) of fused_all_gather_matmul:
    A is a_shard gathered along gather_dim (rank order); with gather_dim
    the last dimension, A @ B contracts the gathered dimension (B has
    world * a_shard[-1] rows)."""
    if len(a_shard) < 2:
        raise ValueError(f"{AG}: a_shard must have at least 2 dimensions, got shape {tuple(a_shard)}")
    if len(bs) == 0:
        raise ValueError(f"{AG}: bs is empty (at least one B)")
    gather_dim = _dim(AG, "gather_dim", gather_dim, len(a_shard))
    a = list(a_shard)
    a[gather_dim] *= world
    k = a[-1]
    outs = []
    for i, b in enumerate(bs):
        if len(b) != 2:
            raise ValueError(f"{AG}: bs[{i}] must be a matrix, got shape {tuple(b)}")
        if b[0] != k:
            raise ValueError(f"{AG}: bs[{i}] has {b[0]} rows, but the gathered A has {k} columns "
                             f"(shape {tuple(a)}: a_shard {tuple(a_shard)} gathered along {gather_dim} over "
                             f"{world} ranks)")
        outs.append(tuple(a[:-1]) + (b[1],))
    return tuple(a), outs


def matmul_reduce_scatter_shape(a: Shape, b: Shape, reduce_op: str, scatter_dim: int, world: int) -> Shape:
    """The shape of fused_matmul_reduce_scatter's result: A @ B reduced over
    the ranks (reduce_op "sum" or "avg") and split along scatter_dim, this
    rank keeping its part."""
    if len(a) < 2:
        raise ValueError(f"{RS}: a must have at least 2 dimensions, got shape {tuple(a)}")
    if len(b) != 2:
        raise ValueError(f"{RS}: b must be a matrix, got shape {tuple(b)}")
    if reduce_op not in REDUCE_OPS:
        raise ValueError(f"{RS}: reduce_op must be one of {', '.join(REDUCE_OPS)}, not {reduce_op!r}")
    scatter_dim = _dim(RS, "scatter_dim", scatter_dim, len(a))
    if a[-1] != b[0]:
        raise ValueError(f"{RS}: a has {a[-1]} columns and b {b[0]} rows (shapes {tuple(a)} and {tuple(b)})")
    out = list(a[:-1]) + [b[1]]
    if out[scatter_dim] % world:
        raise ValueError(f"{RS}: dimension {scatter_dim} of A @ B ({out[scatter_dim]}) does not split over "
                         f"{world} ranks")
    out[scatter_dim] //= world
    return tuple(out)


def rmsnorm_rows(x: Shape, residual: Shape, weight: Shape) -> Tuple[int, int]:
    """(tokens, hidden) of all_reduce_rmsnorm's x: the last dimension is
    hidden, the others the tokens; residual has x's shape, weight (hidden,)."""
    if len(x) < 1:
        raise ValueError(f"{NORM}: x needs a hidden dimension, got a scalar")
    hidden = x[-1]
    tokens = 1
    for d in x[:-1]:
        tokens *= d
    if tuple(residual) != tuple(x):
        raise ValueError(f"{NORM}: residual has shape {tuple(residual)}, x {tuple(x)}: they must be equal")
    if tuple(weight) != (hidden,):
        raise ValueError(f"{NORM}: weight has shape {tuple(weight)}, expected ({hidden},) (x's last dimension)")
    if hidden % 8 or not 8 <= hidden <= NORM_MAX_HIDDEN:
        raise ValueError(f"{NORM}: hidden {hidden} (x's last dimension) must be a multiple of 8 in "
                         f"[8, {NORM_MAX_HIDDEN}]")
    return tokens, hidden
