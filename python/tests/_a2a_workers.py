"""Rank functions of test_all_to_all.py (run by _mp.run_ranks): each runs
a list of all-to-all cases through symmem.Handle and returns what it read
back, so that the test compares every rank against _a2a_ref in the parent.

A case is a dict (every rank gets the same list):
    form        "equal", "v", "2d", "2d_offset" or "round_trip" (a 2-D
                dispatch into a second symmetric buffer, then the combine
                of what arrived, from that buffer, with the dispatch's
                out_splits_offsets as its in_splits_offsets)
    row_bytes   bytes per row (equal: elements are int32, count below)
    experts     experts per rank (2-D forms); experts_last and
                splits_last: what the last rank passes instead (a
                disagreement)
    splits      every rank's split array (rank q uses splits[q]), or
                "past_input": rank 1 sends one row more than its block
                holds to rank 0, every other rank 1 row to each
    offsets     every rank's row offsets (2d_offset)
    out_rows    rows of out (out has 4 more, which must stay untouched)
    major_align the dispatch's alignment
    count       elements per chunk (equal; None: the default)
The input rows of rank q in case c are input_row(c, q, row, row_bytes).
"""

from __future__ import annotations

import struct
from typing import Dict, List

import symmem
from _workers import TIMEOUT, device_of

IN_BYTES = 1 << 16
SPARE_ROWS = 4
OUT_FILL = 0xEE
OSO_FILL = 0x77


def input_row(case: int, rank: int, row: int, row_bytes: int) -> bytes:
    """Row `row` of rank's input in case: says whose row it is."""
    if row_bytes < 12:  # int32 elements of the equal all-to-all
        return struct.pack("<i", (case << 24) ^ (rank << 20) ^ row)[:row_bytes]
    head = struct.pack("<iii", case, rank, row)
    tail = bytes(((rank * 31 + row * 7 + k + case) & 0xFF) for k in range(row_bytes - 12))
    return head + tail


def input_bytes(case: int, rank: int, row_bytes: int, nbytes: int) -> bytes:
    rows = nbytes // row_bytes
    data = b"".join(input_row(case, rank, r, row_bytes) for r in range(rows))
    return data + bytes(nbytes - len(data))


def _i64(buf, n: int, offset: int = 0) -> List[int]:
    return list(struct.unpack(f"<{n}q", buf.read(offset, 8 * n)))


def _error(exc: symmem.SymmemError):
    return (type(exc).__name__, int(exc.code), str(exc))


def run_cases(rank: int, world: int, name: str, cases: List[Dict]) -> Dict:
    dev = device_of(rank)
    results = []
    with symmem.Group(name, rank, world, device=dev, timeout=TIMEOUT) as g:
        with symmem.empty(IN_BYTES, dev) as inp, symmem.empty(IN_BYTES, dev) as mid:
            with symmem.rendezvous(inp, g) as h, symmem.rendezvous(mid, g) as hm:
                avail = h.buffer_size - h.offset
                for c, case in enumerate(cases):
                    results.append(_run_case(c, case, rank, world, dev, h, hm, inp, mid, avail))
                try:
                    device_error = h.device_error()
                except symmem.SymmemError as exc:  # the host backend's flag records a mismatch too
                    device_error = _error(exc)
    return {"avail": avail, "results": results, "device_error": device_error}


def _run_case(c, case, rank, world, dev, h, hm, inp, mid, avail) -> Dict:
    form = case["form"]
    rb = case.get("row_bytes", 4)
    inp.write(input_bytes(c, rank, rb, avail))
    res: Dict = {"error": None}
    if form == "equal":
        count = case.get("count")
        n = (avail // 4 // world) if count is None else count
        with symmem.empty(max(4 * world * n, 4), dev) as out:
            out.write(bytes([OUT_FILL]) * out.nbytes)
            try:
                h.all_to_all("int32", count, out)
            except symmem.SymmemError as exc:
                res["error"] = _error(exc)
            res["out"] = out.read(0, 4 * world * n)
            res["count"] = n
        return res
    experts, splits = case.get("experts", 1), case["splits"]
    if splits == "past_input":  # rank 1 sends one row more than its block holds
        splits = [1] * world if rank != 1 else [avail // rb + 1] + [0] * (world - 1)
    else:
        splits = splits[rank]
    if "experts_last" in case and rank == world - 1:  # this rank disagrees
        experts, splits = case["experts_last"], case["splits_last"]
    S = len(splits)
    out_rows = case["out_rows"]
    out_bytes = (out_rows + SPARE_ROWS) * rb
    with symmem.empty(out_bytes, dev) as out, symmem.empty(16 * S, dev) as spl, \
            symmem.empty(16 * S, dev) as oso:
        out.write(bytes([OUT_FILL]) * out_bytes)
        oso.write(bytes([OSO_FILL]) * (16 * S))
        if form == "2d_offset":
            spl.write(struct.pack(f"<{2 * S}q", *splits, *case["offsets"][rank]))
        else:
            spl.write(struct.pack(f"<{S}q", *splits) + bytes(8 * S))
        try:
            if form == "v":
                h.all_to_all_v(rb, spl, out, out_rows, oso)
            elif form == "2d":
                h.all_to_all_v_2d(rb, experts, spl, out, out_rows, oso, major_align=case.get("major_align", 1))
            elif form == "2d_offset":
                h.all_to_all_v_2d_offset(rb, experts, spl, out, out_rows, oso)
            elif form == "round_trip":
                # The dispatch lands in mid (symmetric: the combine reads it
                # from the peers), the combine sends it back into out.
                mid.write(bytes([OUT_FILL]) * avail)
                mid_rows = avail // rb
                h.all_to_all_v_2d(rb, experts, spl, mid, mid_rows, oso, major_align=case.get("major_align", 1))
                res["dispatch_oso"] = _i64(oso, 2 * S)
                with symmem.empty(16 * S, dev) as oso2:
                    oso2.write(bytes([OSO_FILL]) * (16 * S))
                    hm.all_to_all_v_2d_offset(rb, experts, oso, out, out_rows, oso2)
                    res["combine_oso"] = _i64(oso2, 2 * S)
            else:
                raise ValueError(f"unknown form {form!r}")
        except symmem.SymmemError as exc:
            res["error"] = _error(exc)
        res["out"] = out.read(0, out_bytes)
        res["oso"] = _i64(oso, 2 * S)
    return res
