"""torch_memory_saver.hooks.base's names: both hook modes are libsymmem's
allocator in the drop-in."""

from typing import Literal

HookMode = Literal["preload", "torch"]


class HookUtilBase:
    @staticmethod
    def create(hook_mode: HookMode) -> "HookUtilBase":
        from torch_memory_saver.hooks.mode_preload import HookUtilModePreload
        from torch_memory_saver.hooks.mode_torch import HookUtilModeTorch

        return {"preload": HookUtilModePreload, "torch": HookUtilModeTorch}[hook_mode]()

    def get_path_binary(self):
        from torch_memory_saver.utils import get_binary_path_from_package

        return get_binary_path_from_package("torch_memory_saver_hook_mode_" + self.mode)

    def get_allocator(self):
        return None
