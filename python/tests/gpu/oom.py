"""Out of memory under the global allocator: a Python exception carrying
libsymmem's message, and the process goes on allocating."""

from __future__ import annotations

from _common import install_symmem, result


def main() -> None:
    install_symmem()
    import torch

    import symmem

    x = torch.ones(1 << 20, device="cuda")
    total = torch.cuda.get_device_properties(0).total_memory
    raised = message = None
    is_runtime_error = False
    try:
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    except Exception as e:  # noqa: BLE001 - reported
        raised, message, is_runtime_error = type(e).__name__, str(e), isinstance(e, RuntimeError)
    ys = [torch.full((1 << 20,), float(i), device="cuda") for i in range(8)]
    after_ok = all(float(y.sum()) == float(i) * (1 << 20) for i, y in enumerate(ys)) and float(x.sum()) == 1 << 20

    # The memory-fraction hook sets our limit.
    torch.cuda.set_per_process_memory_fraction(0.25, 0)
    limit = symmem.get_memory_limit(0)
    frac_raised = None
    try:
        torch.empty(int(total * 0.3), dtype=torch.uint8, device="cuda")
    except Exception as e:  # noqa: BLE001
        frac_raised = type(e).__name__
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    big = torch.empty(int(total * 0.3), dtype=torch.uint8, device="cuda")
    big_ok = big.numel() == int(total * 0.3)
    del big, ys, x
    torch.cuda.synchronize()
    symmem.validate(0)
    result(
        raised=raised,
        is_runtime_error=is_runtime_error,
        message=message,
        after_ok=after_ok,
        total=total,
        limit=limit,
        frac_raised=frac_raised,
        big_ok=big_ok,
        ooms=symmem.memory_stats(0)["num_ooms"],
    )


if __name__ == "__main__":
    main()
