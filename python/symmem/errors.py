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
from typing import Dict, Type, Union

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
    "AbortedError",
    "InterruptedError",
    "error_class",
    "make_error",
    "quote",
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
    ABORTED = 13
    INTERRUPTED = 14


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
        # Without a message (made by hand, not from the library), the code
        # says what it can; the library's own text is symmem.strerror(code).
        if not message:
            message = code.name.lower().replace("_", " ") if isinstance(code, Result) else f"unknown result {code}"
        self.message = message
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


class AbortedError(SymmemError, RuntimeError):
    """SYMMEM_ERROR_ABORTED: the group was aborted (Group.abort); destroy it."""


class InterruptedError(SymmemError, builtins.InterruptedError):  # noqa: A001
    """SYMMEM_ERROR_INTERRUPTED: a signal interrupted a wait; the group is
    aborted. From Python the signal's own exception (KeyboardInterrupt for
    Ctrl-C) is raised instead when its handler raises one."""


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
    Result.ABORTED: AbortedError,
    Result.INTERRUPTED: InterruptedError,
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


QUOTE_MAX_CHARS = 64


def quote(s: str) -> str:
    """s quoted for a message, cut at 64 characters with its length stated
    (the library's rule, Note [Bounded messages] in core/quote.go):
    ``"aaaa…" (3000 characters)``."""
    s = str(s)

    def esc(part: str) -> str:
        body = part.replace("\\", "\\\\").replace('"', '\\"')
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in body)

    if len(s) <= QUOTE_MAX_CHARS:
        return f'"{esc(s)}"'
    return f'"{esc(s[:QUOTE_MAX_CHARS])}…" ({len(s)} characters)'
