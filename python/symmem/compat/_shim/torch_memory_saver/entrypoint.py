"""torch_memory_saver.entrypoint's names, as libsymmem's drop-in has them."""

from typing import Literal

from symmem.compat.torch_memory_saver import _TAG_DEFAULT, TorchMemorySaver

CpuBackupBackend = Literal["mmap", "pinned"]

__all__ = ["TorchMemorySaver", "CpuBackupBackend", "_TAG_DEFAULT"]
