"""torch_memory_saver.hooks.mode_preload's names."""

from symmem.compat.torch_memory_saver import configure_subprocess
from torch_memory_saver.hooks.base import HookUtilBase


class HookUtilModePreload(HookUtilBase):
    mode = "preload"


__all__ = ["HookUtilModePreload", "configure_subprocess"]
