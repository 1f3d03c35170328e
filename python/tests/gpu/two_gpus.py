"""The global allocator on two GPUs of one process."""

from __future__ import annotations

import gc

from _common import install_symmem, result


def main() -> None:
    install_symmem()
    import torch

    import symmem

    a = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
    b = a.to("cuda:1")
    c = b * 2
    with torch.cuda.device(1):
        d = torch.ones(3 << 20, device="cuda")  # current device 1
    ok = bool(torch.equal(c.cpu(), a.cpu() * 2)) and d.device.index == 1 and float(d.sum()) == 3 << 20
    on_dev = [symmem.pointer_info(t.data_ptr()).device for t in (a, b, c, d)]
    s0, s1 = symmem.memory_stats(0), symmem.memory_stats(1)
    del a, b, c, d
    gc.collect()
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    for dev in (0, 1):
        symmem.validate(dev)
    result(
        ok=ok,
        devices=on_dev,
        allocs=[s0["allocation.all.allocated"], s1["allocation.all.allocated"]],
        live_after=[symmem.memory_stats(i)["allocation.all.current"] for i in (0, 1)],
    )


if __name__ == "__main__":
    main()
