"""A model's weights in a tagged region with backup and its KV cache in one
without, paused and resumed 20 times on a GPU: outputs identical to before
(eager, and a captured CUDA graph replayed after each resume), the KV cache
zero after each resume, pointers unchanged, and torch.cuda.mem_get_info's
free memory rising by the paused bytes.

Usage: pause_model.py global|mempool
  global   libsymmem is torch's global allocator (region() tags the
           weights' and the cache's tensors directly); eager only: graph
           capture under a pluggable global allocator is not what is tested
  mempool  torch's own allocator, with the weights and the cache in two
           torch.cuda.MemPool's on libsymmem (one per tag) opened inside the
           regions; a CUDA graph (torch's private pool for its activations)
           is captured over the paused weights and replayed after resumes
"""

from __future__ import annotations

import sys

from _common import install_symmem, result

CYCLES = 20


def main(mode: str) -> None:
    if mode == "global":
        install_symmem()
    import torch

    import symmem
    import symmem.torch as st

    torch.manual_seed(0)
    dev = torch.device("cuda", 0)

    def tagged(tag, backup):
        if mode == "mempool":
            return st.tagged_pool(tag, backup=backup)  # a MemPool per tag
        return st.region(tag, backup=backup)

    with tagged("model-weights", True):
        model = torch.nn.Sequential(
            torch.nn.Linear(1024, 4096),
            torch.nn.GELU(),
            torch.nn.Linear(4096, 4096),
            torch.nn.GELU(),
            torch.nn.Linear(4096, 1024),
        ).to(dev)
    with tagged("model-kv", False):
        kv = torch.empty(64 << 20, dtype=torch.float32, device=dev)  # 256 MiB
    x = torch.randn(64, 1024, device=dev)
    ptrs = [p.data_ptr() for p in model.parameters()] + [kv.data_ptr()]
    for p in ptrs:
        symmem.pointer_info(p)  # raises unless the tensors are in our blocks

    def fill_cache():
        kv.fill_(0.5)

    @torch.no_grad()
    def forward(inp):
        return model(inp) * kv[-1]

    fill_cache()
    reference = forward(x).clone()
    graph = None
    static_x = x.clone()
    if mode == "mempool":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                forward(static_x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = forward(static_x)
        graph.replay()
        torch.cuda.synchronize()
        graph_reference_ok = torch.equal(static_out, reference)

    identical, graph_identical, kv_zero, free_rise, paused = [], [], [], [], []
    for _ in range(CYCLES):
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info(0)[0]
        st.pause()  # every tag
        paused.append(symmem.memory_stats(0)["paused_bytes.all.current"])
        free_rise.append(torch.cuda.mem_get_info(0)[0] - free_before)
        st.resume()
        kv_zero.append(int(torch.count_nonzero(kv)) == 0)
        fill_cache()
        identical.append(torch.equal(forward(x), reference))
        if graph is not None:
            graph.replay()
            torch.cuda.synchronize()
            graph_identical.append(torch.equal(static_out, reference))
    now = [p.data_ptr() for p in model.parameters()] + [kv.data_ptr()]
    symmem.validate(0)
    result(
        mode=mode,
        cycles=CYCLES,
        identical=identical,
        graph_identical=graph_identical,
        graph_reference_ok=graph_reference_ok if graph is not None else None,
        kv_zero=kv_zero,
        same_ptrs=now == ptrs,
        paused=paused,
        free_rise=free_rise,
        paused_after=symmem.memory_stats(0)["paused_bytes.all.current"],
    )


if __name__ == "__main__":
    main(sys.argv[1])
