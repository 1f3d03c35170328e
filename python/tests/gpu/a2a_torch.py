"""symmem.torch's all-to-alls bit for bit against torch's own
torch.ops.symm_mem.all_to_all_vdev, all_to_all_vdev_2d and
all_to_all_vdev_2d_offset (the NVSHMEM backend of torch's symmetric
memory) on the same inputs and splits.

usage: a2a_torch.py CASES

Both sides get the same bf16 input (random, seeded by case and rank), the
same split tensor and outs filled alike; out and out_splits_offsets must
then be equal bit for bit (compared as int16 / int64). Splits are random
with zeros; those of all_to_all_vdev are multiples of 64 rows (torch's
kernel asserts on the device when a split's bytes do not divide by its
blocks per peer). The combine of each side runs on that side's dispatch.

Where torch's NVSHMEM backend cannot run here the result says why
(torch_unavailable) and nothing is compared; the test decides whether that
fails (SYMMEM_REQUIRE_GPU=1 with 2 GPUs or more) or skips.
"""

from __future__ import annotations

import datetime
import random
import sys
import traceback

from _symm_common import first_mismatch, run

H = 1024  # bf16 columns: rows of 2 KiB
IN_ROWS = 8192
OUT_ROWS = 3 * IN_ROWS


def body(ctx):
    torch = ctx.torch
    import torch.distributed as dist

    import symmem.torch as st

    cases = int(sys.argv[1])
    W, me, dev = ctx.world, ctx.rank, ctx.device
    ctx.stage("init_process_group(cpu:gloo,cuda:nccl)")
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"file://{ctx.init_file}", rank=me, world_size=W,
                            timeout=datetime.timedelta(seconds=ctx.dist_timeout), device_id=dev)
    gname = dist.group.WORLD.group_name
    ctx.stage("torch symmetric memory, NVSHMEM backend")
    try:
        import torch.distributed._symmetric_memory as symm_mem

        if hasattr(symm_mem, "is_nvshmem_available") and not symm_mem.is_nvshmem_available():
            raise RuntimeError("torch.distributed._symmetric_memory.is_nvshmem_available() is False")
        symm_mem.set_backend("NVSHMEM")
        t_in = symm_mem.empty(IN_ROWS, H, dtype=torch.bfloat16, device=dev)
        t_mid = symm_mem.empty(OUT_ROWS, H, dtype=torch.bfloat16, device=dev)
        t_out = symm_mem.empty(OUT_ROWS, H, dtype=torch.bfloat16, device=dev)
        for t in (t_in, t_mid, t_out):
            symm_mem.rendezvous(t, gname)
        probe_sp = symm_mem.empty(W, dtype=torch.int64, device=dev).fill_(0)
        probe_oso = symm_mem.empty(2, W, dtype=torch.int64, device=dev)
        torch.ops.symm_mem.all_to_all_vdev(t_in, t_out, probe_sp, probe_oso, gname)
        ctx.wait_gpu("torch's all_to_all_vdev probe")
    except Exception as exc:  # noqa: BLE001 - reported: the test skips or fails
        sys.stderr.write(traceback.format_exc())
        return {"torch_unavailable": f"{type(exc).__name__}: {exc}"}

    s_in = st.empty(IN_ROWS, H, dtype=torch.bfloat16, device=ctx.dev)
    s_mid = st.empty(OUT_ROWS, H, dtype=torch.bfloat16, device=ctx.dev)
    s_out = torch.empty(OUT_ROWS, H, dtype=torch.bfloat16, device=dev)

    def same(what, ours, theirs):
        bad = first_mismatch(torch, ours.view(torch.int16) if ours.dtype == torch.bfloat16 else ours,
                             theirs.view(torch.int16) if theirs.dtype == torch.bfloat16 else theirs)
        return None if bad is None else {"what": what, **bad}

    def fill_inputs(case):
        gen = torch.Generator(device=dev)
        gen.manual_seed(case * 100 + me)
        x = torch.randn(IN_ROWS, H, generator=gen, device=dev).to(torch.bfloat16)
        t_in.copy_(x)
        s_in.copy_(x)
        for t in (t_mid, t_out, s_mid, s_out):
            t.fill_(-3.0)

    def sym_splits(shape, values):
        t = symm_mem.empty(*shape, dtype=torch.int64, device=dev)
        t.copy_(torch.tensor(values, dtype=torch.int64).view(shape))
        return t

    rng = random.Random(9090)
    failures, checked = [], 0

    def note(bad):
        nonlocal checked
        checked += 1
        if bad:
            failures.append(bad)

    for case in range(cases):
        fill_inputs(case)
        # all_to_all_vdev: multiples of 64 rows, zeros included
        sp_all = [[64 * (0 if rng.random() < 0.25 else rng.randint(1, IN_ROWS // (64 * W))) for _ in range(W)]
                  for _ in range(W)]
        sp = sp_all[me]
        t_sp, t_oso = sym_splits((W,), sp), symm_mem.empty(2, W, dtype=torch.int64, device=dev).fill_(-7)
        s_sp, s_oso = torch.tensor(sp, dtype=torch.int64, device=dev), torch.full((2, W), -7, dtype=torch.int64,
                                                                                    device=dev)
        ctx.stage(f"case {case}: all_to_all_vdev")
        torch.ops.symm_mem.all_to_all_vdev(t_in, t_out, t_sp, t_oso, gname)
        st.all_to_all_v(s_in, s_out, s_sp, s_oso)
        ctx.wait_gpu("all_to_all_vdev")
        note(same(f"case {case} v out", s_out, t_out))
        note(same(f"case {case} v out_splits_offsets", s_oso, t_oso))

        # all_to_all_vdev_2d then all_to_all_vdev_2d_offset on its result
        E = rng.choice((2, 4, 8))
        align = rng.choice((None, 1, 16, 128))
        S = W * E
        cap = IN_ROWS // S
        sp2 = [0 if rng.random() < 0.3 else rng.randint(1, cap) for _ in range(S)]
        fill_inputs(case + 1000)
        t_sp2, t_oso2 = sym_splits((S,), sp2), symm_mem.empty(2, S, dtype=torch.int64, device=dev).fill_(-7)
        s_sp2, s_oso2 = torch.tensor(sp2, dtype=torch.int64, device=dev), torch.full((2, S), -7, dtype=torch.int64,
                                                                                       device=dev)
        ctx.stage(f"case {case}: all_to_all_vdev_2d E={E} major_align={align}")
        torch.ops.symm_mem.all_to_all_vdev_2d(t_in, t_mid, t_sp2, t_oso2, gname, major_align=align)
        st.all_to_all_v_2d(s_in, s_mid, s_sp2, s_oso2, major_align=align)
        ctx.wait_gpu("all_to_all_vdev_2d")
        note(same(f"case {case} 2d E={E} align={align} out", s_mid, t_mid))
        note(same(f"case {case} 2d E={E} align={align} out_splits_offsets", s_oso2, t_oso2))
        t_oso3 = symm_mem.empty(2, S, dtype=torch.int64, device=dev).fill_(-7)
        s_oso3 = torch.full((2, S), -7, dtype=torch.int64, device=dev)
        ctx.stage(f"case {case}: all_to_all_vdev_2d_offset E={E}")
        torch.ops.symm_mem.all_to_all_vdev_2d_offset(t_mid, t_out, t_oso2, t_oso3, gname)
        st.all_to_all_v_2d_offset(s_mid, s_out, s_oso2, s_oso3)
        ctx.wait_gpu("all_to_all_vdev_2d_offset")
        note(same(f"case {case} 2d_offset E={E} out", s_out, t_out))
        note(same(f"case {case} 2d_offset E={E} out_splits_offsets", s_oso3, t_oso3))
    ctx.wait_gpu("the end")
    dist.barrier()
    return {"checked": checked, "failures": failures[:10]}


if __name__ == "__main__":
    run(body)
