"""A program written for torch_memory_saver (its README's examples), run
unchanged on libsymmem's drop-in: test_compat_gpu.py starts it through
``python -m symmem.compat --`` or after ``symmem.compat.install()``.

Usage: tms_program.py CASE
  simple      region / pause / resume: memory returns to the device while
              paused, addresses stay (contents undefined after the resume,
              as torch_memory_saver's)
  cpu_backup  enable_cpu_backup (pinned and mmap): contents survive 5 cycles,
              get_cpu_backup of a paused tensor equals it
  cuda_graph  a KV cache region and torch_memory_saver.cuda_graph: both tags
              paused and resumed, the graph replayed after the resume gives
              the eager result
  disable     disable() inside a region: that tensor stays live while paused
  training    an inference engine's weights (backup) and KV cache paused, a
              training step of another model in between, then resumed: the
              engine's output is what it was
  init_enable TMS_INIT_ENABLE=1, TMS_INIT_ENABLE_CPU_BACKUP=1: every
              allocation pauseable, a nested region without backup
  vllm        vLLM's CuMemAllocator (symmem.compat.vllm): sleep offloads
              "weights", discards "kv_cache", wake_up restores
  vllm_graph  vLLM's worker habits: weights and KV cache pools, a CUDA graph
              over both captured before the sleep replays right after each
              wake-up (level 1: weights offloaded; level 2: weights dropped
              and reloaded), get_current_usage before and after, and a
              wake_up without room that raises a RuntimeError
              (torch.OutOfMemoryError) and works when retried
  own_device  (2 GPUs) the access the second GPU has to memory of a
              torch_memory_saver region, of a vLLM pool and of libsymmem's
              own pool (cuMemGetAccess): the drop-ins' memory is mapped for
              its own GPU alone, as the originals map theirs
Prints one line RESULT <json>.
"""

from __future__ import annotations

import sys

from _common import result

MiB = 1 << 20


def free_bytes(torch) -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info(0)[0]


def simple():
    import torch
    from torch_memory_saver import torch_memory_saver

    with torch_memory_saver.region():
        x = torch.full((256 * MiB,), 100, dtype=torch.uint8, device="cuda")
    ptr = x.data_ptr()
    f0 = free_bytes(torch)
    torch_memory_saver.pause()
    f1 = free_bytes(torch)
    torch_memory_saver.resume()
    return dict(
        dropin=bool(getattr(sys.modules["torch_memory_saver"], "__symmem_dropin__", False)),
        free_rise=f1 - f0,
        same_ptr=x.data_ptr() == ptr,
        zero_after=bool((x == 0).all().item()),
    )


def cpu_backup():
    import torch
    from torch_memory_saver import torch_memory_saver

    out = {}
    for backend in ("pinned", "mmap"):
        with torch_memory_saver.region(tag=f"w-{backend}", enable_cpu_backup=True, cpu_backup_backend=backend):
            t = torch.randn(64 * MiB // 4, device="cuda")
        ref = t.clone()
        ok, copies = [], []
        for _ in range(5):
            torch_memory_saver.pause(f"w-{backend}")
            copies.append(bool(torch.equal(torch_memory_saver.get_cpu_backup(t), ref.cpu())))
            torch_memory_saver.resume(f"w-{backend}")
            ok.append(bool(torch.equal(t, ref)))
        out[backend] = dict(survived=ok, cpu_copies=copies, live_copy_is_none=torch_memory_saver.get_cpu_backup(t) is None)
    return out


def cuda_graph():
    import torch
    from torch_memory_saver import torch_memory_saver

    with torch_memory_saver.region(tag="kv_cache"):
        kv = torch.full((5, 1 << 20), 1.0, device="cuda")
    x = torch.zeros(5, device="cuda")

    def fn():
        return ((x + kv.mean(dim=1)).unsqueeze(1) * torch.ones(5, 1 << 20, device="cuda")).mean()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch_memory_saver.cuda_graph(g, tag="graph"):
        out = fn()
    results = []
    for value in (2.0, 3.0, 4.0):
        torch_memory_saver.pause("kv_cache")
        torch_memory_saver.pause("graph")
        torch_memory_saver.resume("graph")
        torch_memory_saver.resume("kv_cache")
        kv.fill_(value)
        x.fill_(0.5)
        g.replay()
        torch.cuda.synchronize()
        results.append(abs(out.item() - (value + 0.5)) < 1e-4)
    return dict(replays_ok=results)


def disable():
    import torch
    from torch_memory_saver import torch_memory_saver

    with torch_memory_saver.region(tag="d"):
        a = torch.full((16 * MiB,), 1, dtype=torch.uint8, device="cuda")
        with torch_memory_saver.disable():
            b = torch.full((16 * MiB,), 2, dtype=torch.uint8, device="cuda")
    torch_memory_saver.pause("d")
    b_live = bool((b == 2).all().item())
    torch_memory_saver.resume("d")
    return dict(disabled_live=b_live, tagged_zero=bool((a == 0).all().item()))


def training():
    import torch
    from torch_memory_saver import torch_memory_saver

    torch.manual_seed(0)
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        engine = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    with torch_memory_saver.region(tag="kv_cache"):
        kv = torch.ones(128 * MiB // 4, device="cuda")
    prompt = torch.randn(8, 1024, device="cuda")
    with torch.no_grad():
        before = engine(prompt).clone()
    losses = []
    for step in range(3):
        torch_memory_saver.pause("kv_cache")
        torch_memory_saver.pause("weights")
        # The trainer's step, in the memory the engine gave back.
        trainer = torch.nn.Linear(2048, 2048).cuda()
        opt = torch.optim.SGD(trainer.parameters(), lr=0.1)
        loss = trainer(torch.randn(64, 2048, device="cuda")).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        del trainer, opt, loss
        torch.cuda.empty_cache()
        torch_memory_saver.resume("weights")
        torch_memory_saver.resume("kv_cache")
        kv.fill_(1)
    with torch.no_grad():
        after = engine(prompt)
    return dict(identical=bool(torch.equal(before, after)), losses=losses)


def init_enable():
    import torch
    from torch_memory_saver import torch_memory_saver

    w = torch.full((10_000_000,), 42.0, device="cuda")
    with torch_memory_saver.region(tag="grad_buffer", enable_cpu_backup=False):
        g = torch.full((10_000_000,), 99.0, device="cuda")
    f0 = free_bytes(torch)
    torch_memory_saver.pause()
    f1 = free_bytes(torch)
    torch_memory_saver.resume()
    return dict(
        weights_kept=bool((w == 42.0).all().item()),
        grad_zero=bool((g == 0).all().item()),
        free_rise=f1 - f0,
    )


def vllm():
    import torch
    from symmem.compat.vllm import CuMemAllocator

    alloc = CuMemAllocator.get_instance()
    with alloc.use_memory_pool(tag="weights"):
        w = torch.randn(32 * MiB, device="cuda")
    with alloc.use_memory_pool(tag="kv_cache"):
        kv = torch.ones(64 * MiB, device="cuda")
    ref = w.clone()
    usage = alloc.get_current_usage()
    f0 = free_bytes(torch)
    alloc.sleep(offload_tags=("weights",))
    f1 = free_bytes(torch)
    alloc.wake_up(tags=["weights"])
    weights_ok = bool(torch.equal(w, ref))
    alloc.wake_up()
    return dict(
        usage=usage,
        free_rise=f1 - f0,
        weights_ok=weights_ok,
        kv_zero=bool((kv == 0).all().item()),
    )


def vllm_graph():
    import torch

    import symmem
    from symmem.compat.vllm import CuMemAllocator

    torch.manual_seed(0)
    alloc = CuMemAllocator.get_instance()
    with alloc.use_memory_pool(tag="weights"):
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    with alloc.use_memory_pool(tag="kv_cache"):
        kv = torch.full((64 * MiB // 4,), 0.25, device="cuda")
    x = torch.randn(16, 1024, device="cuda")

    def step():
        return model(x) + kv[:1024].sum()

    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = step()
        g.replay()
        torch.cuda.synchronize()
        ref = out.clone()
        usage0 = alloc.get_current_usage()
        replays = []
        free_rises = []
        for level in (1, 2, 1, 2):
            f0 = free_bytes(torch)
            alloc.sleep(offload_tags=("weights",) if level == 1 else ())
            free_rises.append(free_bytes(torch) - f0)
            alloc.wake_up(tags=["weights"])
            if level == 2:
                model.load_state_dict(state)  # the worker reloads the weights
            alloc.wake_up(tags=["kv_cache"])
            kv.fill_(0.25)  # the engine rebuilds its cache
            g.replay()
            torch.cuda.synchronize()
            replays.append(bool(torch.equal(out, ref)))
        usage1 = alloc.get_current_usage()
        # A wake_up without room: vLLM's callers catch RuntimeError.
        alloc.sleep(offload_tags=("weights",))
        symmem.set_memory_limit(torch.cuda.current_device(), 1 << 20)
        err = {}
        try:
            alloc.wake_up()
        except RuntimeError as e:
            err = dict(
                runtime=True,
                torch_oom=isinstance(e, torch.OutOfMemoryError),
                symmem_oom=isinstance(e, symmem.OutOfMemoryError),
                code=int(getattr(e, "code", -1)),
            )
        symmem.set_memory_limit(torch.cuda.current_device(), 0)
        alloc.wake_up()
        kv.fill_(0.25)
        g.replay()
        torch.cuda.synchronize()
        retried = bool(torch.equal(out, ref))
    return dict(
        replays_ok=replays,
        free_rise_min=min(free_rises),
        weights_bytes=sum(v.numel() * v.element_size() for v in state.values()),
        usage_before=usage0,
        usage_after=usage1,
        oom=err,
        retry_ok=retried,
    )


def own_device():
    import ctypes

    import torch
    import symmem.torch as st
    from symmem.compat.vllm import CuMemAllocator
    from torch_memory_saver import torch_memory_saver

    cu = ctypes.CDLL("libcuda.so.1")

    class Location(ctypes.Structure):  # CUmemLocation
        _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

    def access(t, dev):
        flags = ctypes.c_ulonglong()
        r = cu.cuMemGetAccess(ctypes.byref(flags), ctypes.byref(Location(1, dev)), ctypes.c_ulonglong(t.data_ptr()))
        assert r == 0, f"cuMemGetAccess: CUresult {r}"
        return flags.value

    with torch_memory_saver.region():
        x = torch.ones(64 * MiB, dtype=torch.uint8, device="cuda")
    with CuMemAllocator.get_instance().use_memory_pool(tag="weights"):
        y = torch.ones(64 * MiB, dtype=torch.uint8, device="cuda")
    z = st.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    tms_peer = access(x, 1)
    torch_memory_saver.pause()
    torch_memory_saver.resume()
    return dict(
        ndev=torch.cuda.device_count(),
        tms_own=access(x, 0),
        tms_peer=tms_peer,
        tms_peer_after_resume=access(x, 1),
        vllm_peer=access(y, 1),
        plain_peer=access(z, 1),
    )


CASES = {f.__name__: f for f in (simple, cpu_backup, cuda_graph, disable, training, init_enable, vllm, vllm_graph, own_device)}

if __name__ == "__main__":
    result(**CASES[sys.argv[1]]())
