"""symmem.torch.empty and Buffers on the cuda backend, without changing
torch's allocator: tensors on our heap, freed with the tensor; the CUDA
array interface and DLPack views alias our memory; Buffer.read/write."""

from __future__ import annotations

import gc

from _common import result


def main() -> None:
    import torch

    import symmem
    import symmem.torch as st

    torch.cuda.init()
    base = symmem.memory_stats(0)["allocated_bytes.all.current"]
    t = st.empty(64, 32, dtype=torch.float16)
    shape_ok = t.shape == (64, 32) and t.dtype == torch.float16 and t.device == torch.device("cuda", 0)
    t.fill_(1.5)
    info = symmem.pointer_info(t.data_ptr())
    on_heap = info.requested_size == 64 * 32 * 2
    sum_ok = float(t.float().sum()) == 1.5 * 64 * 32
    del t
    gc.collect()
    torch.cuda.synchronize()
    freed = symmem.memory_stats(0)["allocated_bytes.all.current"] == base

    buf = symmem.empty(4096, 0)
    buf.write(bytes(range(256)) * 16)
    cai = torch.as_tensor(buf, device="cuda")  # __cuda_array_interface__
    cai_ok = cai.data_ptr() == buf.ptr and bool(torch.equal(cai[:256].cpu(), torch.arange(256, dtype=torch.uint8)))
    view = st.as_tensor(buf)  # DLPack
    view[:4].fill_(9)
    torch.cuda.synchronize()
    dlpack_ok = view.data_ptr() == buf.ptr and buf.read(0, 5) == b"\x09\x09\x09\x09\x04"
    del cai, view
    gc.collect()
    buf.free()
    zero = st.empty(0, device="cuda")
    zero_ok = zero.numel() == 0
    del zero
    gc.collect()
    symmem.validate(0)
    result(
        shape_ok=shape_ok,
        on_heap=on_heap,
        sum_ok=sum_ok,
        freed=freed,
        cai_ok=cai_ok,
        dlpack_ok=dlpack_ok,
        zero_ok=zero_ok,
        end=symmem.memory_stats(0)["allocated_bytes.all.current"] - base,
    )


if __name__ == "__main__":
    main()
