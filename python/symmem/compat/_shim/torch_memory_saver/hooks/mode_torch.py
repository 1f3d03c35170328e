"""torch_memory_saver.hooks.mode_torch's names."""

from torch_memory_saver.hooks.base import HookUtilBase


class HookUtilModeTorch(HookUtilBase):
    mode = "torch"


__all__ = ["HookUtilModeTorch"]
