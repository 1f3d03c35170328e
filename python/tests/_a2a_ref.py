"""The all-to-all semantics of include/symmem.h ("All-to-all (expert
parallelism)") in plain Python, for the tests to check libsymmem against.

Each function describes what one receiving rank gets, from every rank's
splits (lists of ints; splits[q] is rank q's array): the splits and offsets
written to its out_splits_offsets, the copies that fill its out (source
rank, first row in the source's input, first row in out, rows), the rows of
out the call needs, and the error, if any, that refuses the call on this
rank. Nothing here needs torch or numpy: the host tests apply the copies to
bytes, the GPU tests to tensors.

Errors (the header's "refused" cases), as (kind, rank):
  ("negative", q)   a negative split (or offset) of rank q: every rank
  ("input", q)      rank q's splits pass its input: every rank
  ("overrun", me)   the rows this rank receives, as laid out (a 2-D
                    dispatch's padding included), pass out_rows: this rank
                    only, and it names itself
The first sender fault in rank order wins; a receiver overrun counts only
when no sender is at fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

Copy = Tuple[int, int, int, int]  # (source rank, source row, out row, rows)


@dataclass
class Received:
    splits: List[int]  # row 0 of out_splits_offsets
    offsets: List[int]  # row 1 of out_splits_offsets
    copies: List[Copy] = field(default_factory=list)
    rows_needed: int = 0  # the end of the last row written to out
    error: Optional[Tuple[str, int]] = None


def exclusive_sum(xs: Sequence[int]) -> List[int]:
    out, acc = [], 0
    for x in xs:
        out.append(acc)
        acc += x
    return out


def _sender_fault(splits: Sequence[Sequence[int]], input_rows: Sequence[int],
                  offsets: Optional[Sequence[Sequence[int]]] = None) -> Optional[Tuple[str, int]]:
    """The first rank whose own splits are bad: a negative split (or offset),
    or splits that pass its input (input_rows[q] rows at the rendezvous
    pointer)."""
    for q, sp in enumerate(splits):
        if any(s < 0 for s in sp) or (offsets is not None and any(o < 0 for o in offsets[q])):
            return ("negative", q)
        if offsets is None:
            if sum(sp) > input_rows[q]:
                return ("input", q)
        elif any(s > 0 and o + s > input_rows[q] for s, o in zip(sp, offsets[q])):
            return ("input", q)
    return None


def _finish(rec: Received, out_rows: int, sender: Optional[Tuple[str, int]], me: int,
            laid_out: Optional[int] = None) -> Received:
    """laid_out: the rows the layout takes (default: up to the last row
    written); past out_rows the call is refused on this rank, naming it."""
    if sender is not None:
        rec.error = sender
        rec.copies = []
        return rec
    rec.rows_needed = max([0] + [dst + n for (_, _, dst, n) in rec.copies])
    if (rec.rows_needed if laid_out is None else laid_out) > out_rows:
        rec.error = ("overrun", me)
        rec.copies = []
    return rec


def all_to_all(world: int, count: int, me: int) -> List[Copy]:
    """Equal splits, in elements: rank p's chunk `me` lands at p * count."""
    return [(p, me * count, p * count, count) for p in range(world)]


def all_to_all_v(splits: Sequence[Sequence[int]], me: int, out_rows: int, input_rows: Sequence[int]) -> Received:
    """symmem_all_to_all_v: splits[q][p] rows from rank q to rank p, taken
    from q's input in rank order; out in source-rank order, packed."""
    world = len(splits)
    got = [splits[q][me] for q in range(world)]
    rec = Received(splits=got, offsets=exclusive_sum(got))
    sender = _sender_fault(splits, input_rows)
    if sender is None:
        for q in range(world):
            src = exclusive_sum(splits[q])[me]
            if got[q]:
                rec.copies.append((q, src, rec.offsets[q], got[q]))
    return _finish(rec, out_rows, sender, me)


def expert_starts(totals: Sequence[int], major_align: int) -> Tuple[List[int], List[int]]:
    """(start row, rows taken) of each expert's group in a 2-D dispatch's
    out: every group starts at a multiple of major_align and an empty one
    still takes major_align rows."""
    taken = [max(-(-t // major_align) * major_align, major_align) for t in totals]
    return exclusive_sum(taken), taken


def all_to_all_v_2d(splits: Sequence[Sequence[int]], experts: int, me: int, out_rows: int,
                    input_rows: Sequence[int], major_align: int = 1) -> Received:
    """symmem_all_to_all_v_2d (the dispatch): splits[q][p * E + e] rows from
    rank q for rank p's local expert e, taken from q's input in that order;
    out grouped by our expert, index i = e * W + s."""
    world, E = len(splits), experts
    got = [splits[s][me * E + e] for e in range(E) for s in range(world)]
    totals = [sum(got[e * world:(e + 1) * world]) for e in range(E)]
    starts, _ = expert_starts(totals, major_align)
    offsets = []
    for e in range(E):
        offsets += [starts[e] + x for x in exclusive_sum(got[e * world:(e + 1) * world])]
    rec = Received(splits=got, offsets=offsets)
    sender = _sender_fault(splits, input_rows)
    if sender is None:
        for e in range(E):
            for s in range(world):
                i = e * world + s
                if got[i]:
                    rec.copies.append((s, exclusive_sum(splits[s])[me * E + e], offsets[i], got[i]))
    return _finish(rec, out_rows, sender, me, dispatch_rows_taken(splits, E, me, major_align))


def dispatch_rows_taken(splits: Sequence[Sequence[int]], experts: int, me: int, major_align: int) -> int:
    """The rows a 2-D dispatch's out spans on rank me, padding included."""
    world = len(splits)
    totals = [sum(splits[s][me * experts + e] for s in range(world)) for e in range(experts)]
    return sum(expert_starts(totals, major_align)[1])


def all_to_all_v_2d_offset(splits: Sequence[Sequence[int]], offsets: Sequence[Sequence[int]], experts: int,
                           me: int, out_rows: int, input_rows: Sequence[int]) -> Received:
    """symmem_all_to_all_v_2d_offset (the combine): on rank q, index
    i = e * W + p holds splits[q][i] rows at row offsets[q][i] of q's input,
    for rank p (what q's expert e sends back to p); out on rank me in
    rank-major order j = q * E + e, packed."""
    world, E = len(splits), experts
    got = [splits[q][e * world + me] for q in range(world) for e in range(E)]
    rec = Received(splits=got, offsets=exclusive_sum(got))
    sender = _sender_fault(splits, input_rows, offsets)
    if sender is None:
        for q in range(world):
            for e in range(E):
                j = q * E + e
                if got[j]:
                    rec.copies.append((q, offsets[q][e * world + me], rec.offsets[j], got[j]))
    return _finish(rec, out_rows, sender, me)


def apply_rows(copies: Sequence[Copy], inputs: Sequence[bytes], out: bytes, row_bytes: int) -> bytes:
    """out with the copies applied, rows of row_bytes bytes (host tests)."""
    buf = bytearray(out)
    for q, src, dst, n in copies:
        buf[dst * row_bytes:(dst + n) * row_bytes] = inputs[q][src * row_bytes:(src + n) * row_bytes]
    return bytes(buf)
