"""Symmetric memory on a job of two nodes, launched with torchrun.

On each of the two nodes (8 GPUs each; NODE_RANK 0 on the first, 1 on the
second, MASTER the first node's address):

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
    torchrun --nnodes 2 --nproc-per-node 8 --node-rank $NODE_RANK \\
        --rdzv-backend c10d --rdzv-endpoint $MASTER:29500 \\
        examples/torchrun_two_nodes.py

On one host, imitating two nodes of 2 GPUs each with one GPU per rank (or
ranks sharing GPUs with SYMMEM_ALLOW_OVERLAPPING_DEVICES=1), force NCCL's
network transport and give each imitated node its own machine identity and
socket directory (two torchrun commands in two shells):

    export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0
    SYMMEM_MACHINE_ID=a SYMMEM_SOCKET_DIR=/tmp/sa torchrun --nnodes 2 --nproc-per-node 2 \\
        --node-rank 0 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29500 examples/torchrun_two_nodes.py
    SYMMEM_MACHINE_ID=b SYMMEM_SOCKET_DIR=/tmp/sb torchrun --nnodes 2 --nproc-per-node 2 \\
        --node-rank 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29500 examples/torchrun_two_nodes.py

Every rank:

  1. joins the NCCL process group (eagerly, device_id=, so that its
     communicator exists for libsymmem);
  2. allocates a symmetric tensor and rendezvouses on it: the ranks of its
     node map each other's tensors; the other node's ranks are reached
     through NCCL (the tensor's segment is an NCCL window);
  3. writes into each peer of its node directly (get_buffer) and checks
     what its node's peers wrote, after a barrier;
  4. runs all_reduce / all_gather / reduce_scatter across both nodes and
     checks them against what every rank put in;
  5. prints one line per rank.
"""

import os

import torch
import torch.distributed as dist

import symmem.torch as st


def main() -> None:
    local = int(os.environ["LOCAL_RANK"])
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()

    n = 1 << 20
    t = st.empty(world, n, dtype=torch.float32, device=dev)
    t.zero_()
    h = st.rendezvous(t)  # collective over the NCCL communicator
    g = st.group_for(None, device=dev.index)
    mine = [r for r in range(world) if g.is_local(r)]

    # 2-3: direct stores into this node's peers, then a barrier across nodes.
    for peer in mine:
        h.get_buffer(peer, (world, n), torch.float32)[rank].fill_(rank + 0.5)
    h.barrier()
    torch.cuda.synchronize()
    rows_ok = all(bool(torch.all(t[w] == w + 0.5)) for w in mine)

    # 4: collectives across both nodes, on the current stream.
    x = st.empty(world * 1024, dtype=torch.float32, device=dev)
    x.fill_(rank + 1)
    st.all_reduce(x)
    sum_ok = bool(torch.all(x == world * (world + 1) / 2))
    y = st.empty(1024, dtype=torch.float32, device=dev)
    y.fill_(rank)
    gathered = st.all_gather(y)
    gather_ok = bool(torch.equal(gathered.view(world, 1024)[:, 0].cpu(), torch.arange(world, dtype=torch.float32)))
    x.fill_(rank + 1)
    part = st.reduce_scatter(x)
    scatter_ok = bool(torch.all(part == world * (world + 1) / 2))
    torch.cuda.synchronize()

    print(f"rank {rank}/{world} on {g.machine(rank)}: local rank {g.local_rank} of {g.local_size}, "
          f"mapped peers {h.handle.mapped_peers}, rows {rows_ok}, all_reduce {sum_ok}, "
          f"all_gather {gather_ok}, reduce_scatter {scatter_ok}", flush=True)
    h.release()
    st.destroy_group()  # libsymmem's part of the group first, then torch's
    dist.barrier()
    dist.destroy_process_group()
    if not (rows_ok and sum_ok and gather_ok and scatter_ok):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
