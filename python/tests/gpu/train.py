"""Train a small model with fixed seeds and deterministic algorithms.

    python train.py {symmem|torch} {mlp|transformer} STEPS

Prints every step's loss bit-exactly (float.hex), so that a run on
libsymmem's allocator can be compared with one on PyTorch's.
Needs CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment.
"""

from __future__ import annotations

import sys

from _common import install_symmem, result


def build(torch, name: str, steps: int):
    nn = torch.nn
    g = torch.Generator().manual_seed(1)
    if name == "mlp":
        model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))
        xs = torch.randn(steps, 32, 64, generator=g)
        ys = torch.randn(steps, 32, 10, generator=g)
        return model, xs, ys

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            layer = nn.TransformerEncoderLayer(
                d_model=64, nhead=4, dim_feedforward=128, dropout=0.1, batch_first=True
            )
            self.enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
            self.head = nn.Linear(64, 10)

        def forward(self, x):
            return self.head(self.enc(x).mean(dim=1))

    model = Net()
    xs = torch.randn(steps, 8, 16, 64, generator=g)
    ys = torch.randn(steps, 8, 10, generator=g)
    return model, xs, ys


def main() -> None:
    which, name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if which == "symmem":
        install_symmem()
    import torch

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # The math attention kernel: deterministic forward and backward.
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)

    dev = torch.device("cuda", 0)
    model, xs, ys = build(torch, name, steps)
    model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for i in range(steps):
        x, y = xs[i].to(dev), ys[i].to(dev)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()).hex())
    torch.cuda.synchronize()
    extra = {}
    if which == "symmem":
        import symmem

        s = symmem.memory_stats(0)
        extra = {"allocations": s["allocation.all.allocated"], "segments": s["segment.all.allocated"]}
    result(losses=losses, **extra)


if __name__ == "__main__":
    main()
