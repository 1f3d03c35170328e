"""torch.cuda.MemPool on libsymmem: the pool's segments are ours, and
deleting the pool gives them back."""

from __future__ import annotations

import gc

from _common import result


def main() -> None:
    import torch

    import symmem
    import symmem.torch as st

    torch.cuda.init()
    before = symmem.memory_stats(0)
    pool = st.mem_pool()
    sizes = [1000, 1 << 20, 5 << 20, 30 << 20]
    with torch.cuda.use_mem_pool(pool):
        xs = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
    for x in xs:
        x.fill_(7)
    sums_ok = all(int(x.sum(dtype=torch.int64)) == 7 * x.numel() for x in xs)
    mid = symmem.memory_stats(0)
    # Every pool tensor lies in one of our blocks (raises if not).
    in_our_blocks = all(symmem.pointer_info(x.data_ptr()).device == 0 for x in xs)
    outside = torch.empty(1000, dtype=torch.uint8, device="cuda")
    try:
        symmem.pointer_info(outside.data_ptr())
        outside_is_ours = True
    except symmem.InvalidPointerError:
        outside_is_ours = False
    del xs, x
    gc.collect()
    torch.cuda.synchronize()
    held_by_pool = symmem.memory_stats(0)["allocated_bytes.all.current"]
    del pool
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    after = symmem.memory_stats(0)
    symmem.empty_cache(0)
    final = symmem.memory_stats(0)
    symmem.validate(0)
    result(
        sums_ok=sums_ok,
        in_our_blocks=in_our_blocks,
        outside_is_ours=outside_is_ours,
        allocated_before=before["allocated_bytes.all.current"],
        allocated_mid=mid["allocated_bytes.all.current"],
        device_allocs=mid["num_device_alloc"] - before["num_device_alloc"],
        held_by_pool=held_by_pool,
        allocated_after=after["allocated_bytes.all.current"],
        reserved_final=final["reserved_bytes.all.current"],
    )


if __name__ == "__main__":
    main()
