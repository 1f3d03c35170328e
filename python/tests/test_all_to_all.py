"""All-to-all through symmem.Handle (no torch) with real processes, against
the plain-Python reference of include/symmem.h's semantics (_a2a_ref.py).

Every layout is checked exactly, byte for byte, on every rank: equal
splits, the v form with random splits (zeros included), one rank receiving
everything, the 2-D dispatch with uneven experts and major_align 1 and 16
(empty experts take major_align rows), the 2-D combine with padding between
the groups, and the round trip (dispatch, then the combine of what arrived)
giving back every rank's input rows. The rows of out that the call does not
fill, and the rows past out_rows, must stay untouched.

The exact tests run on either backend (the host backend in CI; GPUs with
SYMMEM_REQUIRE_GPU=1). The refusals (an overrun of out_rows, a negative
split, splits past the input, ranks that disagree on experts) are errors of
the call only on the host backend; on GPUs the device flag reports them
(test_all_to_all_gpu.py).
"""

from __future__ import annotations

import os
import random
import uuid

import pytest

import _a2a_ref as ref
import symmem
from _a2a_workers import OSO_FILL, OUT_FILL, SPARE_ROWS, input_bytes, run_cases
from _mp import run_ranks
from symmem import Result

pytestmark = pytest.mark.usefixtures("symmetric")


def _no_kernels():
    if os.environ.get("SYMMEM_BACKEND") == "cuda" and "fake" in os.environ.get("SYMMEM_LIBCUDA", ""):
        pytest.skip("make test-fakecuda: the fake CUDA driver runs no kernels")


# -- cases --------------------------------------------------------------------


def _rand_splits(rng: random.Random, n: int, total: int, zeros: float = 0.3):
    """n splits summing to at most total, about a `zeros` share of them 0."""
    xs = [0 if rng.random() < zeros else rng.randint(1, 9) for _ in range(n)]
    s = sum(xs)
    if s > total:
        xs = [x * total // s for x in xs]
    return xs


def _v_out_rows(splits):
    world = len(splits)
    return max(sum(splits[q][p] for q in range(world)) for p in range(world))


def _2d_out_rows(splits, experts, align):
    world = len(splits)
    return max(ref.dispatch_rows_taken(splits, experts, p, align) for p in range(world))


def exact_cases(world: int, seed: int):
    rng = random.Random(seed)
    cases = [{"form": "equal", "count": 5}, {"form": "equal", "count": None}]
    # v: random (zeros included), all zeros, one rank receiving everything
    for rb in (12, 36, 516):
        sp = [_rand_splits(rng, world, 100) for _ in range(world)]
        cases.append({"form": "v", "row_bytes": rb, "splits": sp, "out_rows": _v_out_rows(sp) + 3})
    sp = [[0] * world for _ in range(world)]
    cases.append({"form": "v", "row_bytes": 12, "splits": sp, "out_rows": 1})
    sp = [[40 + q] + [0] * (world - 1) for q in range(world)]
    cases.append({"form": "v", "row_bytes": 20, "splits": sp, "out_rows": _v_out_rows(sp)})  # exactly full
    # 2-D dispatch: uneven experts (some empty everywhere), align 1 and 16,
    # out exactly as long as the padded groups
    for experts, align, rb in ((3, 1, 12), (3, 16, 12), (5, 16, 36), (1, 1, 20), (4, 4, 516)):
        sp = [_rand_splits(rng, world * experts, 90, zeros=0.4) for _ in range(world)]
        for q in range(world):
            sp[q][world * experts - 1] = 0  # the last rank's last expert receives nothing
        cases.append({"form": "2d", "row_bytes": rb, "experts": experts, "major_align": align, "splits": sp,
                      "out_rows": _2d_out_rows(sp, experts, align) + (0 if align > 1 else 5)})
    sp = [[0] * (world * 2) for _ in range(world)]
    cases.append({"form": "2d", "row_bytes": 12, "experts": 2, "major_align": 16, "splits": sp,
                  "out_rows": _2d_out_rows(sp, 2, 16)})
    # 2-D combine with padding between the groups
    for experts, rb in ((2, 12), (3, 36)):
        S = world * experts
        sp = [_rand_splits(rng, S, 60) for _ in range(world)]
        offs = []
        for q in range(world):
            o, at = [], rng.randint(0, 5)
            for x in sp[q]:
                o.append(at)
                at += x + rng.randint(0, 4)  # padding, never sent
            offs.append(o)
        rows = max(sum(sp[q][e * world + p] for q in range(world) for e in range(experts)) for p in range(world))
        cases.append({"form": "2d_offset", "row_bytes": rb, "experts": experts, "splits": sp, "offsets": offs,
                      "out_rows": rows + 2})
    # dispatch then combine: every rank's rows come back in order
    for experts, align in ((2, 1), (3, 16)):
        sp = [_rand_splits(rng, world * experts, 80) for _ in range(world)]
        cases.append({"form": "round_trip", "row_bytes": 12, "experts": experts, "major_align": align, "splits": sp,
                      "out_rows": max(sum(s) for s in sp) + 1})
    return cases


# -- checking -------------------------------------------------------------------


def _expected(c: int, case, rank: int, world: int, avails):
    """(Received, expected out bytes) of rank for case c."""
    rb = case.get("row_bytes", 4)
    inputs_rows = [avails[q] // rb for q in range(world)]
    out0 = bytes([OUT_FILL]) * ((case["out_rows"] + SPARE_ROWS) * rb)
    inputs = [input_bytes(c, q, rb, avails[q]) for q in range(world)]
    form = case["form"]
    if form == "v":
        rec = ref.all_to_all_v(case["splits"], rank, case["out_rows"], inputs_rows)
    elif form == "2d":
        rec = ref.all_to_all_v_2d(case["splits"], case["experts"], rank, case["out_rows"], inputs_rows,
                                  case.get("major_align", 1))
    elif form == "2d_offset":
        rec = ref.all_to_all_v_2d_offset(case["splits"], case["offsets"], case["experts"], rank, case["out_rows"],
                                         inputs_rows)
    else:
        raise AssertionError(form)
    return rec, ref.apply_rows(rec.copies, inputs, out0, rb)


def _check_round_trip(c, case, results, world, avails):
    rb, E, align = case["row_bytes"], case["experts"], case.get("major_align", 1)
    mids = []
    recs = []
    for p in range(world):
        rec = ref.all_to_all_v_2d(case["splits"], E, p, avails[p] // rb, [a // rb for a in avails], align)
        assert rec.error is None
        recs.append(rec)
        mid0 = bytes([OUT_FILL]) * avails[p]
        mids.append(ref.apply_rows(rec.copies, [input_bytes(c, q, rb, avails[q]) for q in range(world)], mid0, rb))
    back_splits = [r.splits for r in recs]
    back_offsets = [r.offsets for r in recs]
    for p in range(world):
        res = results[p]["results"][c]
        assert res["error"] is None, (p, case, res["error"])
        assert res["dispatch_oso"] == recs[p].splits + recs[p].offsets, (p, c)
        comb = ref.all_to_all_v_2d_offset(back_splits, back_offsets, E, p, case["out_rows"], [a // rb for a in avails])
        assert res["combine_oso"] == comb.splits + comb.offsets, (p, c)
        want = ref.apply_rows(comb.copies, mids, bytes([OUT_FILL]) * ((case["out_rows"] + SPARE_ROWS) * rb), rb)
        assert res["out"] == want, (p, c)
        # the round trip's promise: this rank's own input rows, in order
        n = sum(case["splits"][p])
        assert res["out"][: n * rb] == input_bytes(c, p, rb, avails[p])[: n * rb], (p, c)
        assert res["out"][n * rb:] == bytes([OUT_FILL]) * (len(res["out"]) - n * rb), (p, c)
        # the combine's splits are what the rank sent, in its send order
        assert comb.splits == case["splits"][p]


def check_exact(cases, results, world):
    avails = [r["avail"] for r in results]
    for c, case in enumerate(cases):
        if case["form"] == "round_trip":
            _check_round_trip(c, case, results, world, avails)
            continue
        for p in range(world):
            res = results[p]["results"][c]
            assert res["error"] is None, (p, c, case, res["error"])
            if case["form"] == "equal":
                n = res["count"]
                want = b"".join(input_bytes(c, q, 4, avails[q])[4 * p * n: 4 * (p + 1) * n] for q in range(world))
                assert res["out"] == want, (p, c, n)
                continue
            rec, want = _expected(c, case, p, world, avails)
            assert rec.error is None, (p, c, rec.error)
            assert res["oso"] == rec.splits + rec.offsets, (p, c, case)
            assert res["out"] == want, (p, c, case)
    for p in range(world):
        assert results[p]["device_error"] == 0


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_layout_exact(world):
    _no_kernels()
    cases = exact_cases(world, seed=1000 + world)
    results = run_ranks(run_cases, world, f"a2a-{uuid.uuid4().hex[:12]}", cases)
    check_exact(cases, results, world)


def test_reference_round_trip_and_alignment():
    """The reference itself, on a case worked by hand (W = 2, E = 2):
    rank 0 sends [1, 2 | 0, 3] (rank 0's experts 0, 1 | rank 1's), rank 1
    sends [4, 0 | 5, 6]."""
    sp = [[1, 2, 0, 3], [4, 0, 5, 6]]
    r0 = ref.all_to_all_v_2d(sp, 2, 0, 100, [100, 100], major_align=4)
    # rank 0's expert 0 gets 1 (from 0) + 4 (from 1) rows: 8 rows with
    # alignment; expert 1 gets 2 + 0 and starts at 8.
    assert r0.splits == [1, 4, 2, 0] and r0.offsets == [0, 1, 8, 10]
    assert r0.copies == [(0, 0, 0, 1), (1, 0, 1, 4), (0, 1, 8, 2)]
    r1 = ref.all_to_all_v_2d(sp, 2, 1, 100, [100, 100], major_align=1)
    assert r1.splits == [0, 5, 3, 6] and r1.offsets == [0, 0, 5, 8]
    # an expert that receives nothing still takes major_align rows
    empty = ref.all_to_all_v_2d([[0, 2], [0, 1]], 2, 0, 100, [100, 100], major_align=16)
    assert empty.offsets == [0, 0, 16, 18]
    # the combine sends rank 0's rows back in its own send order
    back = ref.all_to_all_v_2d_offset([r0.splits, r1.splits], [r0.offsets, r1.offsets], 2, 0, 100, [100, 100])
    assert back.splits == sp[0] and back.offsets == [0, 1, 3, 3]


# -- refusals (host backend: the call itself fails) -------------------------------


def _row_bytes_of(case):
    return case.get("row_bytes", 4)


@pytest.mark.parametrize("world", [2, 3])
def test_refusals(world, host_backend):
    last = world - 1
    cases = []
    # 0: rank 0 receives more than out_rows, all of it from rank 1
    sp = [[0] * world for _ in range(world)]
    sp[1][0] = 30
    sp[0][1] = 3
    cases.append({"form": "v", "row_bytes": 12, "splits": sp, "out_rows": 20})
    # 1: the 2-D dispatch overruns on rank 1 only
    sp = [[0] * (world * 2) for _ in range(world)]
    sp[0][2] = 15  # rank 0 -> rank 1's expert 0
    sp[0][1] = 2   # rank 0 -> its own expert 1
    cases.append({"form": "2d", "row_bytes": 12, "experts": 2, "major_align": 1, "splits": sp, "out_rows": 10})
    # 2: a negative split on the last rank
    sp = [[1] * world for _ in range(world)]
    sp[last][0] = -1
    cases.append({"form": "v", "row_bytes": 12, "splits": sp, "out_rows": 10})
    # 3: rank 1's splits pass its input by one row (the worker sizes them
    # from its block)
    cases.append({"form": "v", "row_bytes": 12, "splits": "past_input", "out_rows": 10})
    # 4: the last rank passes one expert more than the others
    sp = [[1] * (world * 2) for _ in range(world)]
    cases.append({"form": "2d", "row_bytes": 12, "experts": 2, "splits": sp, "out_rows": 40, "experts_last": 3,
                  "splits_last": [1] * (world * 3)})
    # 5: a negative offset in the combine
    sp = [[1] * (world * 2) for _ in range(world)]
    offs = [[2 * i for i in range(world * 2)] for _ in range(world)]
    offs[1][0] = -4
    cases.append({"form": "2d_offset", "row_bytes": 12, "experts": 2, "splits": sp, "offsets": offs, "out_rows": 40})
    # 6: a call that works, after all of them
    sp = [[2] * world for _ in range(world)]
    cases.append({"form": "v", "row_bytes": 12, "splits": sp, "out_rows": 2 * world})
    results = run_ranks(run_cases, world, f"a2ar-{uuid.uuid4().hex[:12]}", cases)
    avails = [r["avail"] for r in results]
    rows = avails[0] // 12
    assert all(a // 12 == rows for a in avails), avails

    def untouched(res, case):
        return res["out"] == bytes([OUT_FILL]) * ((case["out_rows"] + SPARE_ROWS) * _row_bytes_of(case))

    for p in range(world):
        got = [r for r in results[p]["results"]]
        # 0: refused on rank 0 only, naming it (test_an_overrun_names_the_receiver)
        if p == 0:
            name, code, msg = got[0]["error"]
            assert (name, code) == ("InvalidArgumentError", Result.INVALID_ARGUMENT), got[0]["error"]
            assert untouched(got[0], cases[0])
            rec = ref.all_to_all_v(cases[0]["splits"], 0, 20, [rows] * world)
            assert rec.error == ("overrun", 0) and "rank 0 receives" in msg, msg
            assert got[0]["oso"][:world] == rec.splits  # what was received
        else:
            assert got[0]["error"] is None, (p, got[0]["error"])
            rec, want = _expected(0, cases[0], p, world, avails)
            assert got[0]["out"] == want and got[0]["oso"] == rec.splits + rec.offsets
        # 1: the dispatch refused on rank 1 only
        if p == 1:
            name, code, msg = got[1]["error"]
            assert (name, code) == ("InvalidArgumentError", Result.INVALID_ARGUMENT), got[1]["error"]
            assert untouched(got[1], cases[1])
        else:
            assert got[1]["error"] is None, (p, got[1]["error"])
            rec, want = _expected(1, cases[1], p, world, avails)
            assert got[1]["out"] == want and got[1]["oso"] == rec.splits + rec.offsets
        # 2, 3, 5: a sender's bad splits fail the call on every rank
        for c, bad in ((2, last), (3, 1), (5, 1)):
            assert got[c]["error"] is not None, (p, c)
            name, code, msg = got[c]["error"]
            assert (name, code) == ("InvalidArgumentError", Result.INVALID_ARGUMENT), (p, c, got[c]["error"])
            assert f"rank {bad}" in msg, (p, c, msg)
            assert untouched(got[c], cases[c]), (p, c)
        # 4: the argument agreement: MismatchError on every rank, naming the last
        name, code, msg = got[4]["error"]
        assert (name, code) == ("MismatchError", Result.MISMATCH), (p, got[4]["error"])
        assert f"rank {last}" in msg, msg
        assert untouched(got[4], cases[4])
        # 6: the group still works
        assert got[6]["error"] is None, (p, got[6]["error"])
        rec, want = _expected(6, cases[6], p, world, avails)
        assert got[6]["out"] == want


def test_an_overrun_names_the_receiver(host_backend):
    """include/symmem.h: a call whose received rows would pass out_rows is
    refused on that receiver, naming it (no one sender overran: the sum
    did); the sender's call succeeds. Rank 0 receives 30 rows from rank 1
    alone, into room for 20."""
    sp = [[0, 0], [30, 0]]
    case = {"form": "v", "row_bytes": 12, "splits": sp, "out_rows": 20}
    assert ref.all_to_all_v(sp, 0, 20, [100, 100]).error == ("overrun", 0)
    results = run_ranks(run_cases, 2, f"a2an-{uuid.uuid4().hex[:12]}", [case])
    name, code, msg = results[0]["results"][0]["error"]
    assert (name, code) == ("InvalidArgumentError", Result.INVALID_ARGUMENT)
    assert "rank 0 receives 30 rows" in msg, msg
    assert results[1]["results"][0]["error"] is None


def test_a_dispatch_is_refused_when_its_layout_passes_out(host_backend):
    """A dispatch's out must hold its rows as laid out, padding included (a
    grouped GEMM reads every group whole): with major_align 16, 3 rows for
    expert 0 and none for expert 1 take 32 rows, which out_rows 20 cannot
    hold, although the rows written end at row 3; out_rows 32 can."""
    sp = [[3, 0, 0, 0], [0, 0, 0, 0]]
    rec = ref.all_to_all_v_2d(sp, 2, 0, 20, [100, 100], major_align=16)
    assert rec.error == ("overrun", 0) and ref.dispatch_rows_taken(sp, 2, 0, 16) == 32
    for out_rows, refused in ((20, True), (32, False)):
        case = {"form": "2d", "row_bytes": 12, "experts": 2, "major_align": 16, "splits": sp, "out_rows": out_rows}
        results = run_ranks(run_cases, 2, f"a2ao-{uuid.uuid4().hex[:12]}", [case])
        avails = [r["avail"] for r in results]
        for p in range(2):
            res = results[p]["results"][0]
            if refused:
                assert res["error"] is not None and res["error"][1] == Result.INVALID_ARGUMENT, (p, res["error"])
                assert f"rank {p} receives 32 rows" in res["error"][2], res["error"]
                continue
            assert res["error"] is None, (p, res["error"])
            rec, want = _expected(0, case, p, 2, avails)
            assert res["out"] == want and res["oso"] == rec.splits + rec.offsets, p


# -- arguments ---------------------------------------------------------------------


def test_arguments_are_checked_before_anything_runs():
    """One rank: Python's checks name the argument; the library refuses
    row_bytes 0, experts < 1, S > 1024, major_align < 1, NULL pointers and a
    misaligned in_splits with nothing run."""
    dev = 0
    with symmem.Group(f"a2aa-{uuid.uuid4().hex[:10]}", 0, 1, device=dev, timeout=30) as g, \
            symmem.empty(4096, dev) as inp, symmem.empty(4096, dev) as out, symmem.empty(8192 * 2 + 16, dev) as sp, \
            symmem.empty(4096 * 8, dev) as oso, symmem.rendezvous(inp, g) as h:
        sp.write(bytes(sp.nbytes))
        with pytest.raises(TypeError, match="row_bytes must be an int"):
            h.all_to_all_v("12", sp, out, 10, oso)
        with pytest.raises(symmem.InvalidArgumentError, match="out_rows -1 is out of range"):
            h.all_to_all_v(12, sp, out, -1, oso)
        with pytest.raises(symmem.InvalidArgumentError, match="in_splits must be None, an int address or a Buffer"):
            h.all_to_all_v(12, "splits", out, 10, oso)
        with pytest.raises(symmem.InvalidArgumentError, match="major_align .* out of range for its C type int64_t"):
            h.all_to_all_v_2d(12, 1, sp, out, 10, oso, major_align=1 << 70)
        with pytest.raises(symmem.InvalidArgumentError, match="experts .* out of range for its C type int"):
            h.all_to_all_v_2d(12, 1 << 40, sp, out, 10, oso)
        with pytest.raises(symmem.InvalidArgumentError, match='unknown dtype "complex64"'):
            h.all_to_all("complex64", 4, out)
        # the library's own checks
        for call in (
            lambda: h.all_to_all_v(0, sp, out, 10, oso),                      # row_bytes 0
            lambda: h.all_to_all_v_2d(12, 0, sp, out, 10, oso),               # experts < 1
            lambda: h.all_to_all_v_2d(12, 1025, sp, out, 10, oso),            # S > 1024
            lambda: h.all_to_all_v_2d(12, 1, sp, out, 10, oso, major_align=0),
            lambda: h.all_to_all_v(12, None, out, 10, oso),                   # NULL in_splits
            lambda: h.all_to_all_v(12, sp, None, 10, oso),                    # NULL out
            lambda: h.all_to_all_v(12, sp, out, 10, None),                    # NULL out_splits_offsets
            lambda: h.all_to_all_v(12, sp.ptr + 4, out, 10, oso),             # in_splits not 8-byte aligned
            lambda: h.all_to_all("int32", 4, None),                           # NULL out
        ):
            with pytest.raises(symmem.InvalidArgumentError) as exc:
                call()
            assert exc.value.code == Result.INVALID_ARGUMENT
        # nothing ran: the splits array and out are as they were
        assert sp.read(0, 64) == bytes(64)
    with pytest.raises(symmem.InvalidStateError):
        h.all_to_all_v(12, sp, out, 10, oso)


# -- symmem.torch (where torch is installed) --------------------------------------------


def test_torch_operators_on_tensors(tmp_path):
    """symmem.torch's all_to_all, all_to_all_v, all_to_all_v_2d and
    all_to_all_v_2d_offset on tensors (CPU tensors on the host backend),
    against the reference, and their argument checks."""
    pytest.importorskip("torch", reason="PyTorch is not installed: the torch all-to-all test needs it")
    _no_kernels()
    import _a2a_torch_workers as tw

    world, experts, align = 3, 2, 4
    rng = random.Random(77)
    splits_v = [_rand_splits(rng, world, 120) for _ in range(world)]
    splits_2d = [_rand_splits(rng, world * experts, 120) for _ in range(world)]
    results = run_ranks(tw.run, world, str(tmp_path / "init"), splits_v, splits_2d, experts, align)
    R, OUT = tw.ROWS, tw.OUT_ROWS
    rows = [[tw.row_values(q, r) for r in range(R)] for q in range(world)]

    def apply(copies):
        out = [[-1.0] * tw.H for _ in range(OUT)]
        for q, src, dst, n in copies:
            out[dst:dst + n] = rows[q][src:src + n]
        return out

    per = R * tw.H // world  # elements per chunk of the equal all-to-all
    flat = [[v for row in rows[q] for v in row] for q in range(world)]
    for p, res in enumerate(results):
        want = [v for q in range(world) for v in flat[q][p * per:(p + 1) * per]]
        assert [v for row in res["equal"] for v in row] == want, p
        assert res["equal_int64"] == [q * 1000 + p * 6 + k for q in range(world) for k in range(6)], p
        rec = ref.all_to_all_v(splits_v, p, OUT, [R] * world)
        assert res["v"] == (apply(rec.copies), [rec.splits, rec.offsets]), p
        rec2 = ref.all_to_all_v_2d(splits_2d, experts, p, OUT, [R] * world, align)
        assert res["dispatch"] == (apply(rec2.copies), [rec2.splits, rec2.offsets]), p
        n = sum(splits_2d[p])
        back, oso = res["combine"]
        assert back[:n] == rows[p][:n] and back[n:] == [[-1.0] * tw.H] * (OUT - n), p
        assert oso[0] == splits_2d[p], p
        bad = res["bad"]
        for name, words in {
            "in_splits_dtype": "in_splits must be int64",
            "in_splits_shape": f"in_splits has shape ({world + 1},), expected ({world},)",
            "oso_shape": f"out_splits_offsets has shape ({world},), expected (2, {world})",
            "out_dtype": "out is torch.float64, input torch.float32",
            "out_rows": "out's rows (stride(0) 5) differ from input's (stride(0) 4)",
            "out_contiguous": "out must be contiguous",
            "input_contiguous": "input must be contiguous",
            "experts": f"in_splits holds {world * experts + 1} splits, not a positive multiple of the world size {world}",
            "major_align": "major_align must be at least 1, got 0",
            "offsets_shape": "in_splits_offsets must have shape (2, world_size * experts)",
            "oso_contiguous": "out_splits_offsets must be contiguous",
            "equal_out": f"out must be a contiguous torch.float32 tensor of {R * tw.H} elements",
            "device": "in_splits is on cpu",
        }.items():
            if name in bad:
                assert bad[name] is not None and words in bad[name], (name, bad[name])


def test_torch_compile_traces_the_operators_without_a_graph_break(tmp_path):
    """torch.compile(fullgraph=True) of an MoE exchange: one graph holding
    the symmem operators in call order (the backend keeps the graph and
    runs nothing), and fake implementations that check shapes."""
    pytest.importorskip("torch", reason="PyTorch is not installed: the torch.compile test needs it")
    import _a2a_torch_workers as tw

    res = run_ranks(tw.compile_graph, 1, str(tmp_path / "init"))[0]
    assert len(res["graphs"]) == 1, res["graphs"]
    code = res["graphs"][0]
    calls = [line.split("torch.ops.symmem.")[1].split("(")[0] for line in code.splitlines() if "torch.ops.symmem." in line]
    assert calls == ["all_to_all_v_2d", "all_to_all_v_2d_offset", "all_to_all_v", "all_to_all"], code
    assert "'', 16)" in code  # the group ("" the default) and major_align travel as constants
    assert res["refused"] == "symmem.torch.all_to_all_v_2d: out_splits_offsets has shape (2, 3), expected (2, 2)"
    assert res["all_to_all_shape"] == (8,)
