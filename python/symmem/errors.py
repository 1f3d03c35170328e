"""Result codes and the exceptions that carry them.

Every failure of the C library is a code (``enum symmem_result``) and a
per-thread message naming the call. :class:`SymmemError` carries both as
``.code`` (a :class:`Result`) and ``.message``. Each code has a subclass that
also derives from the matching built-in exception, so callers may write
``except MemoryError`` or ``except TimeoutError`` as well as
``except symmem.OutOfMemoryError``.
"""

from __future__ import annotations

import builtins
import enum
from typing import Callable, Dict, Optional, Type, TypeVar, Union

from . import _lib

__all__ = [
    "Result",
    "SymmemError",
    "InvalidArgumentError",
    "OutOfMemoryError",
    "InvalidPointerError",
    "InvalidDeviceError",
    "BackendError",
    "UnavailableError",
    "TimeoutError",
    "MismatchError",
    "PeerError",
    "PermissionError",
    "InvalidStateError",
    "InternalError",
    "check",
    "check_pointer",
    "check_last_error",
    "error_from_last",
    "strerror",
]


class Result(enum.IntEnum):
    """``enum symmem_result``; the values are fixed by the C ABI."""

    SUCCESS = 0
    INVALID_ARGUMENT = 1
    OUT_OF_MEMORY = 2
    INVALID_POINTER = 3
    INVALID_DEVICE = 4
    BACKEND = 5
    UNAVAILABLE = 6
    TIMEOUT = 7
    MISMATCH = 8
    PEER = 9
    PERMISSION = 10
    INVALID_STATE = 11
    INTERNAL = 12


class SymmemError(Exception):
    """A failure reported by libsymmem.

    Attributes:
        code: the :class:`Result` (a plain int for a code this package does
            not know).
        message: the library's message for the failing call.
    """

    def __init__(self, code: Union[Result, int], message: str = ""):
        try:
            code = Result(code)
        except ValueError:
            code = int(code)
        self.code = code
        self.message = message or strerror(int(code))
        super().__init__(self.message)

    def __str__(self) -> str:
        name = self.code.name if isinstance(self.code, Result) else str(self.code)
        return f"{self.message} [{name}]"

    def __reduce__(self):
        # Picklable (multiprocessing carries exceptions between processes).
        return (type(self), (int(self.code), self.message))


class InvalidArgumentError(SymmemError, ValueError):
    """SYMMEM_ERROR_INVALID_ARGUMENT: a bad size, rank, channel or NULL."""


class OutOfMemoryError(SymmemError, MemoryError):
    """SYMMEM_ERROR_OUT_OF_MEMORY: the memory limit or the device said no."""


class InvalidPointerError(SymmemError, ValueError):
    """SYMMEM_ERROR_INVALID_POINTER: not allocated here, or already freed."""


class InvalidDeviceError(SymmemError, ValueError):
    """SYMMEM_ERROR_INVALID_DEVICE: a device index out of range."""


class BackendError(SymmemError, OSError):
    """SYMMEM_ERROR_BACKEND: the driver or the OS failed."""


class UnavailableError(SymmemError, RuntimeError):
    """SYMMEM_ERROR_UNAVAILABLE: the backend or feature cannot run here."""


class TimeoutError(SymmemError, builtins.TimeoutError):  # noqa: A001
    """SYMMEM_ERROR_TIMEOUT: a wait ran out of time."""


class MismatchError(SymmemError, ValueError):
    """SYMMEM_ERROR_MISMATCH: ranks disagree (sizes, offsets, members)."""


class PeerError(SymmemError, ConnectionError):
    """SYMMEM_ERROR_PEER: a peer failed, died or broke the protocol."""


class PermissionError(SymmemError, builtins.PermissionError):  # noqa: A001
    """SYMMEM_ERROR_PERMISSION: a peer of another user, or a refused operation."""


class InvalidStateError(SymmemError, RuntimeError):
    """SYMMEM_ERROR_INVALID_STATE: the call is not allowed now."""


class InternalError(SymmemError, RuntimeError):
    """SYMMEM_ERROR_INTERNAL: a bug in libsymmem."""


_CLASSES: Dict[int, Type[SymmemError]] = {
    Result.INVALID_ARGUMENT: InvalidArgumentError,
    Result.OUT_OF_MEMORY: OutOfMemoryError,
    Result.INVALID_POINTER: InvalidPointerError,
    Result.INVALID_DEVICE: InvalidDeviceError,
    Result.BACKEND: BackendError,
    Result.UNAVAILABLE: UnavailableError,
    Result.TIMEOUT: TimeoutError,
    Result.MISMATCH: MismatchError,
    Result.PEER: PeerError,
    Result.PERMISSION: PermissionError,
    Result.INVALID_STATE: InvalidStateError,
    Result.INTERNAL: InternalError,
}


def error_class(code: int) -> Type[SymmemError]:
    """The exception class for a result code."""
    return _CLASSES.get(int(code), SymmemError)


def int_arg(value, name: str, what: str) -> int:
    """value as an int for the C call what, or TypeError saying that name
    must be an int: 4096.0 or "4096" are refused rather than converted or
    passed to ctypes (anything with __index__, such as numpy's integers,
    is an int; bool is not)."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{what}: {name} must be an int, not {type(value).__name__} {value!r}")
    return value.__index__()


def make_error(code: int, message: str = "") -> SymmemError:
    """An exception of the right class for code."""
    return error_class(code)(code, message)


def strerror(code: int) -> str:
    """The library's fixed description of a code."""
    s = _lib.lib().symmem_strerror(int(code))
    if not s or s == b"unknown result code":  # one static string for every unknown code
        return f"unknown result {int(code)}"
    return s.decode("utf-8", "replace")


def _last_message() -> str:
    s = _lib.lib().symmem_last_error_message()
    return s.decode("utf-8", "replace") if s else ""


def error_from_last(fallback_code: int = Result.INTERNAL, what: str = "") -> SymmemError:
    """An exception built from the calling thread's last error.

    When the last error is SUCCESS (the library failed without saying why),
    fallback_code and a message naming ``what`` are used instead.
    """
    code = int(_lib.lib().symmem_last_error())
    if code == Result.SUCCESS:
        return make_error(fallback_code, f"{what}: failed without setting an error")
    return make_error(code, _last_message())


def check(code: int, what: str = "") -> None:
    """Raise the matching SymmemError unless code is SUCCESS.

    The message is the thread's last error message when the last error has
    the same code (it always should), else the code's description.
    """
    code = int(code)
    if code == Result.SUCCESS:
        return
    lib = _lib.lib()
    message = _last_message() if int(lib.symmem_last_error()) == code else ""
    if not message:
        message = f"{what}: {strerror(code)}" if what else strerror(code)
    raise make_error(code, message)


T = TypeVar("T")


def check_pointer(fn: Callable[..., Optional[int]], *args, what: str = "") -> int:
    """Call a pointer-returning function; raise from the last error on NULL.

    The last error is cleared first, so a stale error from an earlier call is
    never reported for this one.
    """
    lib = _lib.lib()
    lib.symmem_clear_last_error()
    ptr = fn(*args)
    if not ptr:
        raise error_from_last(what=what or getattr(fn, "__name__", "call"))
    return ptr


def check_last_error(fn: Callable[..., T], *args, what: str = "") -> T:
    """Call a function that reports failure only through the last error.

    For void functions such as symmem_free: clear, call, raise if set.
    """
    lib = _lib.lib()
    lib.symmem_clear_last_error()
    out = fn(*args)
    code = int(lib.symmem_last_error())
    if code != Result.SUCCESS:
        raise make_error(code, _last_message())
    return out
