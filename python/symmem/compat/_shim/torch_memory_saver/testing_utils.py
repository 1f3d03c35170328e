"""torch_memory_saver.testing_utils' helpers that its example programs use."""

import torch

from torch_memory_saver.utils import is_xpu


def get_device() -> str:
    return "xpu" if is_xpu() else "cuda"


def empty_cache() -> None:
    torch.cuda.empty_cache()


def get_and_print_gpu_memory(message, gpu_id=0):
    """Device memory in use (as the driver counts it), printed with message."""
    free, total = torch.cuda.mem_get_info(gpu_id)
    mem = total - free
    print(f"GPU {gpu_id} memory: {mem / 1024 ** 3:.2f} GB ({message})")
    return mem
