"""torch_memory_saver, as libsymmem's drop-in (symmem.compat.install put
this directory first on the path). The names are those of
symmem.compat.torch_memory_saver."""

from symmem.compat.torch_memory_saver import TorchMemorySaver, configure_subprocess, torch_memory_saver

__symmem_dropin__ = True
__all__ = ["TorchMemorySaver", "configure_subprocess", "torch_memory_saver"]
