"""Many live zero-size tensors (among others), freed in a random order."""

from __future__ import annotations

import gc
import random

from _common import install_symmem, result


def main() -> None:
    install_symmem()
    import torch

    import symmem

    torch.cuda.init()
    warm = torch.empty(16, device="cuda")
    del warm
    torch.cuda.synchronize()
    base = symmem.memory_stats(0)["allocated_bytes.all.current"]
    ts = []
    for i in range(3000):
        if i % 7 == 3:
            ts.append(torch.full((i * 13,), 1.0, device="cuda"))
        else:
            ts.append(torch.empty(0, device="cuda"))
    zero_ptrs = [t.data_ptr() for t in ts if t.numel() == 0]
    nonzero_zero_ptrs = [p for p in zero_ptrs if p]
    distinct = len(set(nonzero_zero_ptrs)) == len(nonzero_zero_ptrs)
    live = symmem.memory_stats(0)["allocation.all.current"]
    order = list(range(len(ts)))
    random.Random(7).shuffle(order)
    sums_ok = True
    for n, i in enumerate(order):
        if n % 500 == 0:
            sums_ok &= all(float(t.sum()) == t.numel() for t in ts[:50] if t is not None)
        ts[i] = None
    gc.collect()
    torch.cuda.synchronize()
    end = symmem.memory_stats(0)["allocated_bytes.all.current"]
    symmem.validate(0)
    result(
        distinct=distinct,
        zero_ptrs=len(zero_ptrs),
        nonnull_zero_ptrs=len(nonzero_zero_ptrs),
        live=live,
        sums_ok=sums_ok,
        base=base,
        end=end,
    )


if __name__ == "__main__":
    main()
