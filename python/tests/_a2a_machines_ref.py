"""What an all-to-all must deliver, written from include/symmem.h's
all-to-all section (independently of the library): shared by the
imitated-machines tests on the NCCL stand-in (_machine_workers.py) and on
GPUs (gpu/a2a_machines.py).

Layouts: 0 all_to_all_v (one split per rank), 1 all_to_all_v_2d (the
dispatch), 2 all_to_all_v_2d_offset (the combine). A table is a rank's
in_splits: S = world * experts splits, then (the combine) S row offsets."""

from __future__ import annotations

import random
from typing import List, Tuple

V, V2D, V2D_OFFSET = 0, 1, 2
NAMES = {V: "all_to_all_v", V2D: "all_to_all_v_2d", V2D_OFFSET: "all_to_all_v_2d_offset"}


def row_byte(call: int, rank: int, row: int, b: int) -> int:
    """Byte b of row `row` of rank's input in call number `call`."""
    return (call * 131 + rank * 71 + row * 13 + b * 7 + 1) % 256


def input_rows(call: int, rank: int, rows: int, row_bytes: int) -> bytes:
    return bytes(row_byte(call, rank, k, b) for k in range(rows) for b in range(row_bytes))


def dest(layout: int, world: int, experts: int, j: int) -> int:
    """The rank that entry j of a table goes to."""
    if layout == V2D:
        return j // experts
    if layout == V2D_OFFSET:
        return j % world
    return j


def source_rows(layout: int, table: List[int], S: int) -> List[int]:
    """The input row each entry of a table starts at."""
    if layout == V2D_OFFSET:
        return table[S : 2 * S]
    out, at = [], 0
    for n in table[:S]:
        out.append(at)
        at += n
    return out


def expected(layout: int, tables: List[List[int]], world: int, experts: int, align: int, r: int):
    """(splits, offsets, pieces) rank r receives: out_splits_offsets' two
    rows, and for each piece (sender, first input row, rows, out row)."""
    E, S = experts, world * experts
    order: List[Tuple[int, int]] = []  # (sender, entry of its table), in out order
    if layout == V:
        order = [(s, r) for s in range(world)]
    elif layout == V2D:
        order = [(s, r * E + e) for e in range(E) for s in range(world)]
    else:
        order = [(s, e * world + r) for s in range(world) for e in range(E)]
    splits, offsets, pieces = [], [], []
    at = 0
    group_start = 0
    for i, (s, j) in enumerate(order):
        if layout == V2D and i % world == 0 and i > 0:
            # The previous expert's rows end aligned, and take align rows at least.
            n = max(-(-(at - group_start) // align) * align, align)
            at = group_start + n
        if layout == V2D and i % world == 0:
            group_start = at
        n = tables[s][j]
        splits.append(n)
        offsets.append(at)
        pieces.append((s, source_rows(layout, tables[s], S)[j], n, at))
        at += n
    return splits, offsets, pieces


def random_tables(rng: random.Random, layout: int, world: int, experts: int, skew: bool) -> List[List[int]]:
    """Every rank's table: splits in [0, 5] (zeros among them), or with
    skew everything for rank 0; the combine's offsets leave gaps."""
    S = world * experts
    tables = []
    for _ in range(world):
        t = [rng.randint(0, 5) for _ in range(S)]
        if skew:
            t = [n if dest(layout, world, experts, j) == 0 else 0 for j, n in enumerate(t)]
        if layout == V2D_OFFSET:
            offs, at = [], 0
            for n in t:
                at += rng.randint(0, 2)
                offs.append(at)
                at += n
            t = t + offs
        tables.append(t)
    return tables


def rows_needed(layout: int, tables: List[List[int]], world: int, experts: int) -> int:
    """The input rows every rank's table reaches (the most of any rank)."""
    S = world * experts
    most = 0
    for t in tables:
        src = source_rows(layout, t, S)
        most = max([most] + [src[j] + t[j] for j in range(S)])
    return most
