"""torch_memory_saver, as libsymmem's drop-in (symmem.compat.install put
this directory first on the path). The names are those of
symmem.compat.torch_memory_saver. With TMS_INIT_ENABLE=1 the drop-in starts
at this import, as torch_memory_saver's preloaded library does at process
start: libsymmem becomes torch's allocator before the program allocates."""

import os

from symmem.compat.torch_memory_saver import TorchMemorySaver, configure_subprocess, torch_memory_saver

from . import entrypoint, hooks, utils  # noqa: F401 - torch_memory_saver's submodules (testing_utils needs torch)

__symmem_dropin__ = True
__all__ = ["TorchMemorySaver", "configure_subprocess", "torch_memory_saver"]

if os.environ.get("TMS_INIT_ENABLE", "").lower() in ("1", "true", "yes", "on"):
    torch_memory_saver._ensure_initialized()
