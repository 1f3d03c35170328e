"""The all-to-alls on GPUs against the plain-Python reference (_a2a_ref).

usage: a2a_check.py MAX_SPLIT_ROWS

Every rank generates every rank's input (random bytes seeded by case and
rank) and every rank's splits (seeded by case) on its GPU, so each one
builds its expected out by applying the reference's copies to those inputs
with tensor slices; every comparison is exact (torch.equal on the bytes),
padding rows and the rows past out_rows included (they must keep their
fill). Cases: equal splits (four dtypes, several counts), the v form, the
2-D dispatch (1 to 8 experts, major_align 1, 16, 128) and the 2-D combine
(padding between the groups), with random splits of 0 to MAX_SPLIT_ROWS
rows (zeros, one rank receiving everything, rows of 2 to 7168 bytes); the
round trip (dispatch into a symmetric buffer, combine of what arrived)
gives back every rank's rows. Last, on groups of their own (a refused call
leaves the group's results undefined): rank 0 receiving more than out_rows
is refused on rank 0 alone, and a negative split of the last rank on every
rank, out untouched, the device error flag naming the rank.
"""

from __future__ import annotations

import random
import sys

import _a2a_ref as ref
from _symm_common import error_info, first_mismatch, run

IN_BYTES = 64 << 20
FILL = 0xEE


def body(ctx):
    torch = ctx.torch
    import symmem
    import symmem.torch as st

    max_rows = int(sys.argv[1])
    W, me, dev = ctx.world, ctx.rank, ctx.device
    info = symmem.collectives_load(ctx.dev)
    g = ctx.group("a2a")
    inp = st.empty(IN_BYTES, dtype=torch.uint8, device=ctx.dev)
    mid = st.empty(IN_BYTES, dtype=torch.uint8, device=ctx.dev)
    h = symmem.rendezvous(inp.data_ptr(), g)
    hm = symmem.rendezvous(mid.data_ptr(), g)
    avail = h.buffer_size - h.offset
    cap = min(avail, IN_BYTES)  # the input bytes the cases fill and send
    stream = ctx.cur()
    failures, checked = [], 0

    def inputs(case, nbytes):
        xs = []
        for q in range(W):
            gen = torch.Generator(device=dev)
            gen.manual_seed(case * 1000 + q)
            xs.append(torch.randint(0, 256, (nbytes,), generator=gen, device=dev, dtype=torch.uint8))
        return xs

    def expect(copies, xs, rb, nbytes):
        want = torch.full((nbytes,), FILL, dtype=torch.uint8, device=dev)
        for q, src, dst, n in copies:
            want[dst * rb:(dst + n) * rb] = xs[q][src * rb:(src + n) * rb]
        return want

    def record(what, got, want):
        nonlocal checked
        checked += 1
        bad = first_mismatch(torch, got, want)
        if bad:
            failures.append({"what": what, **bad})

    def splits_of(rng, n, hi, zeros=0.25):
        return [0 if rng.random() < zeros else rng.randint(1, hi) for _ in range(n)]

    def fit(splits, rb):
        """Scale every rank's splits down to what its input holds."""
        rows = cap // rb
        out = []
        for sp in splits:
            s = sum(sp)
            out.append([x * rows // s for x in sp] if s > rows else sp)
        return out

    case = 0
    # Equal splits.
    for dt, counts in ((torch.bfloat16, (1, 7, 4096, 1 << 20)), (torch.float32, (3, 65536)),
                       (torch.float16, (129,)), (torch.int32, (1 << 21,))):
        for count in counts:
            case += 1
            es = torch.tensor([], dtype=dt).element_size()
            nbytes = W * count * es
            if nbytes > avail:
                continue
            xs = inputs(case, nbytes)
            inp[:nbytes].copy_(xs[me])
            out = torch.full((nbytes,), FILL, dtype=torch.uint8, device=dev)
            ctx.stage(f"all_to_all {dt} {count}")
            h.all_to_all(dt, count, out.data_ptr(), stream)
            ctx.wait_gpu("all_to_all")
            want = torch.cat([xs[q][me * count * es:(me + 1) * count * es] for q in range(W)])
            record(f"all_to_all {dt} count={count}", out, want)

    rng = random.Random(4242)
    # The v form and the 2-D forms, several row sizes.
    for rb, hi in ((2, max_rows), (12, 40), (256, max_rows), (7168, max(1, max_rows // 8))):
        for variant in ("random", "random", "one_receiver", "zeros"):
            case += 1
            if variant == "random":
                sp = fit([splits_of(rng, W, hi) for _ in range(W)], rb)
            elif variant == "one_receiver":
                sp = fit([[rng.randint(1, hi)] + [0] * (W - 1) for _ in range(W)], rb)
            else:
                sp = [[0] * W for _ in range(W)]
            out_rows = max(sum(sp[q][p] for q in range(W)) for p in range(W)) + 1
            rec = ref.all_to_all_v(sp, me, out_rows, [avail // rb] * W)
            xs = inputs(case, cap)
            inp[:cap].copy_(xs[me])
            nbytes = (out_rows + 4) * rb
            out = torch.full((nbytes,), FILL, dtype=torch.uint8, device=dev)
            oso = torch.full((2, W), -7, dtype=torch.int64, device=dev)
            spt = torch.tensor(sp[me], dtype=torch.int64, device=dev)
            ctx.stage(f"all_to_all_v rb={rb} {variant}")
            h.all_to_all_v(rb, spt, out, out_rows, oso, stream)
            ctx.wait_gpu("all_to_all_v")
            record(f"all_to_all_v rb={rb} {variant} splits", oso.cpu(), torch.tensor([rec.splits, rec.offsets]))
            record(f"all_to_all_v rb={rb} {variant} out", out, expect(rec.copies, xs, rb, nbytes))

    for E, align, rb, hi in ((1, 1, 12, 30), (4, 1, 256, max_rows // 4), (4, 16, 2, max_rows), (8, 128, 7168, 64),
                             (8, 1, 4096, max_rows // 8), (3, 16, 516, 200)):
        for variant in ("random", "empty_experts"):
            case += 1
            S = W * E
            sp = fit([splits_of(rng, S, max(1, hi)) for _ in range(W)], rb)
            if variant == "empty_experts":  # experts 0 and E-1 of every rank get nothing
                for q in range(W):
                    for p in range(W):
                        sp[q][p * E] = 0
                        sp[q][p * E + E - 1] = 0
            out_rows = max(ref.dispatch_rows_taken(sp, E, p, align) for p in range(W))
            if (out_rows + 4) * rb > avail:
                continue
            rec = ref.all_to_all_v_2d(sp, E, me, out_rows, [avail // rb] * W, align)
            xs = inputs(case, cap)
            inp[:cap].copy_(xs[me])
            nbytes = (out_rows + 4) * rb
            out = torch.full((nbytes,), FILL, dtype=torch.uint8, device=dev)
            oso = torch.full((2, S), -7, dtype=torch.int64, device=dev)
            spt = torch.tensor(sp[me], dtype=torch.int64, device=dev)
            what = f"all_to_all_v_2d E={E} align={align} rb={rb} {variant}"
            ctx.stage(what)
            h.all_to_all_v_2d(rb, E, spt, out, out_rows, oso, align, stream)
            ctx.wait_gpu(what)
            record(what + " splits", oso.cpu(), torch.tensor([rec.splits, rec.offsets]))
            record(what + " out", out, expect(rec.copies, xs, rb, nbytes))

            # The combine: from the dispatch's layout (in mid, symmetric),
            # with padding between the groups, rows sent back packed.
            offs = [ref.all_to_all_v_2d(sp, E, q, out_rows, [avail // rb] * W, align).offsets for q in range(W)]
            back_sp = [ref.all_to_all_v_2d(sp, E, q, out_rows, [avail // rb] * W, align).splits for q in range(W)]
            comb = ref.all_to_all_v_2d_offset(back_sp, offs, E, me, max(sum(s) for s in sp) + 1, [avail // rb] * W)
            mids = [expect(ref.all_to_all_v_2d(sp, E, q, out_rows, [avail // rb] * W, align).copies, xs, rb, nbytes)
                    for q in range(W)]
            mid[:nbytes].copy_(mids[me])
            cb_rows = max(sum(s) for s in sp) + 1
            cb_bytes = (cb_rows + 4) * rb
            back = torch.full((cb_bytes,), FILL, dtype=torch.uint8, device=dev)
            oso2 = torch.full((2, S), -7, dtype=torch.int64, device=dev)
            what = f"all_to_all_v_2d_offset E={E} align={align} rb={rb} {variant}"
            ctx.stage(what)
            hm.all_to_all_v_2d_offset(rb, E, oso, back, cb_rows, oso2, stream)  # in_splits_offsets: the dispatch's
            ctx.wait_gpu(what)
            record(what + " splits", oso2.cpu(), torch.tensor([comb.splits, comb.offsets]))
            record(what + " out", back, expect(comb.copies, mids, rb, cb_bytes))
            # the round trip: this rank's own rows, in order
            n = sum(sp[me]) * rb
            record(what + " round trip", back[:n], xs[me][:n])
    ctx.wait_gpu("exact cases")
    device_error = h.device_error()

    # Refusals, each on a group of its own.
    refusals = {}
    for what in ("overrun", "negative"):
        gr = ctx.group(f"refuse-{what}")
        hr = symmem.rendezvous(inp.data_ptr(), gr)
        rb = 16
        sp = [[0] * W for _ in range(W)]
        if what == "overrun":
            sp[W - 1][0] = 100  # rank 0 gets 100 rows from the last rank into room for 50
            for q in range(W - 1):
                sp[q][W - 1] = 3
        else:
            sp = [[2] * W for _ in range(W)]
            sp[W - 1][0] = -1
        out_rows = 50
        out = torch.full(((out_rows + 4) * rb,), FILL, dtype=torch.uint8, device=dev)
        oso = torch.full((2, W), -7, dtype=torch.int64, device=dev)
        spt = torch.tensor(sp[me], dtype=torch.int64, device=dev)
        ctx.stage(f"refusal: {what}")
        hr.all_to_all_v(rb, spt, out, out_rows, oso, stream)
        ctx.wait_gpu(f"refusal {what}")
        res = {"untouched": bool((out == FILL).all()), "received": oso[0].cpu().tolist()}
        try:
            res["flag"] = hr.device_error()
        except symmem.SymmemError as exc:
            res.update(error_info(exc, 0.0))
        refusals[what] = res
    return {"checked": checked, "failures": failures[:10], "device_error": device_error, "refusals": refusals,
            "kernels": info}


if __name__ == "__main__":
    run(body)
