"""torch_memory_saver.utils, as libsymmem's drop-in has it: the helpers
that programs and tests written for torch_memory_saver import."""

import contextlib
import logging
import os
from functools import lru_cache

from symmem.errors import quote

logger = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def is_xpu() -> bool:
    """Whether torch runs on an Intel XPU (libsymmem's drop-in supports CUDA
    only, so this is False wherever the drop-in works)."""
    try:
        import torch
    except ImportError:
        return False
    return hasattr(torch, "xpu") and torch.xpu.is_available()


def get_binary_path_from_package(stem: str):
    """torch_memory_saver's hook binaries do not exist here: libsymmem's
    drop-in runs on libsymmem (``symmem.library_path()``)."""
    raise RuntimeError(
        f"torch_memory_saver.utils.get_binary_path_from_package({quote(stem)}): libsymmem's drop-in has no "
        "torch_memory_saver binary (nothing to LD_PRELOAD); use symmem.compat.install() or python -m symmem.compat"
    )


@contextlib.contextmanager
def change_env(key: str, value: str):
    """Set the environment variable key to value inside the block, then
    put back what was there (absent stays absent)."""
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old
