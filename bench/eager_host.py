"""Where an uncaptured collective's host time goes: each rank times N calls
of each step of the path in a Python loop (time.perf_counter, the GPU left
to run behind), 2 ranks on 2 GPUs, bf16, 4 KiB, in place.

    python3 bench/eager_host.py [--calls 2000]

Rows: a libsymmem C call that does no work (symmem_handle_rank: ctypes and
the C-to-Go entry), a bare launch of an empty kernel through the driver with
ctypes (the floor), symmem_collective through ctypes with its arguments
ready (the C call and the launch), the same through the call module
symmem._calls, symmem.torch.all_reduce (the whole
eager path), torch's two_shot_all_reduce_ and one_shot_all_reduce, a torch
add_ (one kernel launch through torch's dispatcher), and NCCL's all_reduce.
Host microseconds per call, every rank. NVLink multicast stays off.
"""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})


EMPTY_PTX = b""".version 7.8
.target sm_90
.address_size 64
.visible .entry symmem_empty()
{
  ret;
}
"""


def bare_launch(stream):
    """A launch of an empty kernel through the driver with ctypes: the floor
    of any collective's host path (the same ctypes cost as symmem's)."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    assert cu.cuModuleLoadData(ctypes.byref(mod), EMPTY_PTX) == 0
    assert cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"symmem_empty") == 0
    f = cu.cuLaunchKernel
    f.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    f.restype = ctypes.c_int
    fp = fn.value
    return lambda: f(fp, 1, 1, 1, 32, 1, 1, 0, stream, None, None)


def rank_main(rank, world, port, calls):
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    import symmem
    import symmem.torch as st
    from symmem import _lib

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=dev)
    gname = dist.group.WORLD.group_name
    n = 2048
    t = st.empty(n, dtype=torch.bfloat16, device=dev).fill_(1)
    tin = symm_mem.empty(n, dtype=torch.bfloat16, device=dev).fill_(1)
    symm_mem.rendezvous(tin, gname)
    nin = torch.ones(n, dtype=torch.bfloat16, device=dev)
    st.all_reduce(t)
    h = st._fast_entry(torch, t, None)
    lib = _lib.lib()
    fn, rank_fn = lib.symmem_collective, lib.symmem_handle_rank
    calls = _lib.calls()  # symmem._calls where built, else ctypes (its .extension says)
    if rank == 0:
        print("call module:", "symmem._calls" if calls.extension else f"ctypes ({_lib.calls_fallback_reason})")
    ptr = h[2]
    stream = torch.cuda.current_stream(dev).cuda_stream
    launch = bare_launch(stream)
    steps = {
        "symmem_handle_rank (ctypes + C-to-Go)": lambda: rank_fn(ptr),
        "cuLaunchKernel of an empty kernel (ctypes)": launch,
        "symmem_collective, arguments ready": lambda: fn(ptr, 0, 2, 0, n, None, 0, 0, stream),
        "symmem_collective via symmem._calls": lambda: calls.collective(ptr, 0, 2, 0, n, None, 0, 0, stream),
        "symmem.torch.all_reduce": lambda: st.all_reduce(t),
        "torch two_shot_all_reduce_": lambda: torch.ops.symm_mem.two_shot_all_reduce_(tin, "sum", gname),
        "torch one_shot_all_reduce": lambda: torch.ops.symm_mem.one_shot_all_reduce(tin, "sum", gname),
        "torch add_ (one launch)": lambda: nin.add_(0),
        "nccl all_reduce": lambda: dist.all_reduce(nin),
    }
    out = {}
    for name, f in steps.items():
        for _ in range(20):
            f()
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        out[name] = ((t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6)
    for r in range(world):
        dist.barrier()
        if r == rank:
            for name, (host, total) in out.items():
                print(f"rank {rank} {name:42s} host {host:7.2f} us/call   with the GPU {total:7.2f} us/call", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--child", nargs=3)
    a = ap.parse_args()
    if a.child:
        rank_main(int(a.child[0]), int(a.child[1]), int(a.child[2]), a.calls)
        return 0
    port = 29400 + os.getpid() % 1000
    env = dict(os.environ, SYMMEM_BACKEND="cuda")
    procs = [subprocess.Popen([sys.executable, __file__, "--calls", str(a.calls), "--child", str(r), "2", str(port)], env=env)
             for r in range(2)]
    return max(p.wait(timeout=600) for p in procs)


if __name__ == "__main__":
    sys.exit(main())
