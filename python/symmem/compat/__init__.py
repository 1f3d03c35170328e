"""Drop-ins: other libraries' pause/resume APIs on libsymmem.

- :mod:`symmem.compat.torch_memory_saver`: torch_memory_saver's API
  (``torch_memory_saver.region/pause/resume/...``);
- :mod:`symmem.compat.vllm`: vLLM's sleep-mode allocator
  (``CuMemAllocator.get_instance().sleep/wake_up/...``).

Both map onto libsymmem's tags, regions and symmem_pause/symmem_resume; see
docs/dropin.md for every difference.

To run a program written for torch_memory_saver unchanged::

    import symmem.compat
    symmem.compat.install()          # before the program imports torch_memory_saver
    import torch_memory_saver        # libsymmem's drop-in

or, for a launcher, ``python -m symmem.compat -- python train.py ...``.

How :func:`install` works: the package ships a shim directory holding a
``torch_memory_saver`` package that re-exports this drop-in. install() puts
that directory first on ``sys.path`` (this process) and on ``PYTHONPATH``
(every subprocess started afterwards, whatever it runs), so both resolve
``import torch_memory_saver`` to the shim before any installed copy. No
``sitecustomize`` or ``.pth`` file is written, and nothing outside the
process's environment changes.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import Dict, Iterator, Mapping, Tuple, Type

from .. import errors as _errors
from ..errors import InvalidArgumentError, Result, SymmemError, env_bool, quote

__all__ = ["SHIM_DIR", "install", "installed", "original_error"]

SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shim")


_TAG_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")


def _check_tag(api: str, tag, max_len: int, empty_hint: str = "") -> None:
    """Check a drop-in's tag: a str of 1 to max_len letters, digits, '.',
    '_', '-' (the drop-in adds a prefix, so max_len is under libsymmem's 64).
    The errors name api, the drop-in's class."""
    if not isinstance(tag, str):
        raise TypeError(f"tag must be a str, not {type(tag).__name__}")
    if tag == "":
        raise InvalidArgumentError(Result.INVALID_ARGUMENT, f"{api}: the tag is the empty string; libsymmem's drop-in refuses it{empty_hint}")
    if len(tag) > max_len or not _TAG_CHARS.match(tag):
        raise InvalidArgumentError(
            Result.INVALID_ARGUMENT, f"{api}: tag {quote(tag)}: libsymmem's drop-in takes tags of 1 to {max_len} letters, digits, '.', '_', '-'"
        )


# -- errors as the originals raise them -------------------------------------
#
# torch_memory_saver and vLLM raise RuntimeError where their calls fail (a
# CUDA error, no memory at a wake-up), torch.OutOfMemoryError where torch
# runs out, ValueError for bad arguments; callers catch those. The drop-ins
# raise libsymmem's own exception (its class, .code and .message) made a
# subclass of the original's type too: symmem.InvalidArgumentError is
# already a ValueError and InvalidStateError a RuntimeError; the others get
# a subclass here that adds RuntimeError, and out of memory adds
# torch.OutOfMemoryError (itself a RuntimeError) where torch is imported.
# The classes are module attributes, so the exceptions pickle.

_RUNTIME_CLASSES: Dict[Tuple[Type[SymmemError], type], type] = {}


def _derived(cls: Type[SymmemError], base: type) -> type:
    key = (cls, base)
    out = _RUNTIME_CLASSES.get(key)
    if out is None:
        suffix = "Torch" if base is not RuntimeError else "Runtime"
        name = f"{cls.__name__}{suffix}"
        out = type(
            name,
            (cls, base),
            {
                "__module__": __name__,
                "__doc__": f"{cls.__doc__ or cls.__name__} Raised by the drop-ins: also a {base.__module__}.{base.__qualname__}, as the original library raises there.",
                "__reduce__": lambda self: (_rebuild, (cls.__name__, base is not RuntimeError, int(self.code), self.message)),
            },
        )
        _RUNTIME_CLASSES[key] = out
        globals()[name] = out
    return out


def _rebuild(name: str, torch_base: bool, code: int, message: str):
    cls = getattr(_errors, name)
    return original_error(cls(code, message), torch_oom=torch_base)


def original_error(exc: BaseException, torch_oom: bool = True) -> BaseException:
    """exc (a libsymmem exception) as a drop-in raises it: the same class,
    code and message, and also an instance of what torch_memory_saver or
    vLLM raise there (RuntimeError; torch.OutOfMemoryError for out of
    memory where torch is imported; ValueError as it is for bad
    arguments). Other exceptions come back unchanged."""
    if not isinstance(exc, SymmemError):
        return exc
    base: type = RuntimeError
    if isinstance(exc, _errors.OutOfMemoryError):
        torch = sys.modules.get("torch") if torch_oom else None
        base = getattr(torch, "OutOfMemoryError", None) or RuntimeError
    elif isinstance(exc, (RuntimeError, ValueError)):
        return exc
    if isinstance(exc, base):
        return exc
    new = _derived(type(exc), base)(exc.code, exc.message)
    new.__traceback__ = exc.__traceback__
    return new


@contextlib.contextmanager
def _original_errors() -> Iterator[None]:
    """Raise libsymmem's exceptions inside the block as original_error says."""
    try:
        yield
    except SymmemError as exc:
        new = original_error(exc)
        if new is exc:
            raise
        raise new from None


def _env_bool(name: str) -> bool:
    """The environment variable name as a switch (unset: off), by the
    library's rule for booleans (symmem.errors.env_bool; an unreadable value
    raises InvalidArgumentError, a ValueError)."""
    return env_bool(name, False)


def _subprocess_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """The variables that make a subprocess import the drop-in: PYTHONPATH
    with the shim directory first (and the directory of this symmem package,
    so the shim finds it)."""
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parts = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in (SHIM_DIR, pkg_root)]
    return {"PYTHONPATH": os.pathsep.join([SHIM_DIR, pkg_root] + parts)}


def installed() -> bool:
    """Whether ``import torch_memory_saver`` gives libsymmem's drop-in here."""
    mod = sys.modules.get("torch_memory_saver")
    if mod is not None:
        return bool(getattr(mod, "__symmem_dropin__", False))
    return bool(sys.path) and sys.path[0] == SHIM_DIR


def install() -> None:
    """Make ``import torch_memory_saver`` resolve to libsymmem's drop-in in
    this process and in the subprocesses it starts from now on.

    Raises RuntimeError if the real torch_memory_saver is already imported
    here (its allocations could not be paused by libsymmem)."""
    mod = sys.modules.get("torch_memory_saver")
    if mod is not None and not getattr(mod, "__symmem_dropin__", False):
        raise RuntimeError(
            f"symmem.compat.install(): torch_memory_saver is already imported from {getattr(mod, '__file__', '?')}; "
            "call install() before the program imports it"
        )
    if SHIM_DIR in sys.path:
        sys.path.remove(SHIM_DIR)
    sys.path.insert(0, SHIM_DIR)
    os.environ.update(_subprocess_env(os.environ))
