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
import ctypes
import os
import reprlib
from typing import Dict, NamedTuple, Type, Union

# Result is enum symmem_result, written from the Go table (Note [Enum tables]
# in core/enum.go).
from ._enums import Result

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
    "brief",
    "int_arg",
    "CType",
    "C_INT",
    "C_UINT",
    "C_INT64",
    "C_SIZE",
    "C_PTR",
]


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


class CType(NamedTuple):
    """A C integer type of include/symmem.h: its name and inclusive range."""

    name: str
    lo: int
    hi: int


_PTR_BITS = 8 * ctypes.sizeof(ctypes.c_void_p)
_SIZE_BITS = 8 * ctypes.sizeof(ctypes.c_size_t)
_INT_BITS = 8 * ctypes.sizeof(ctypes.c_int)

#: ``int`` (devices, ranks, channels, world sizes, byte values).
C_INT = CType("int", -(1 << (_INT_BITS - 1)), (1 << (_INT_BITS - 1)) - 1)
#: ``unsigned int`` / ``uint32_t`` (flags).
C_UINT = CType("unsigned int", 0, (1 << 32) - 1)
#: ``int64_t`` (timeouts in milliseconds).
C_INT64 = CType("int64_t", -(1 << 63), (1 << 63) - 1)
#: ``size_t`` (sizes, counts, offsets).
C_SIZE = CType("size_t", 0, (1 << _SIZE_BITS) - 1)
#: a pointer (addresses, streams, communicators) as an unsigned integer.
C_PTR = CType("a pointer", 0, (1 << _PTR_BITS) - 1)


def int_arg(value, name: str, what: str, ctype: CType) -> int:
    """value as an int for the C parameter name (of C type ctype) of the
    call what, checked before ctypes sees it (ctypes keeps the low bits of
    an int that does not fit, silently: device 2**32 would be device 0).

    Raises TypeError saying that name must be an int for anything else:
    4096.0 or "4096" are refused rather than converted (anything with
    __index__, such as numpy's integers, is an int; bool is not); raises
    InvalidArgumentError naming the call, the parameter, the value and the
    C type's range for an int outside it, whichever side (an allocation's
    size of 2**70 does not fit, as 2**32 as a device does not).
    Messages are bounded (Note [Bounded messages] in core/quote.go): the
    value is shown through :func:`brief`.
    """
    if type(value) is int and ctype.lo <= value <= ctype.hi:  # the common case, first
        return value
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{what}: {name} must be an int, not {brief(value)}")
    v = value.__index__()
    if ctype.lo <= v <= ctype.hi:
        return v
    raise make_error(
        Result.INVALID_ARGUMENT,
        f"{what}: {name} {int_text(v)} is out of range for its C type {ctype.name} [{ctype.lo}, {ctype.hi}]",
    )


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def env_bool(name: str, default: bool) -> bool:
    """The boolean setting name, read by the library's rule for booleans
    (Note [Settings] in core/settings.go): 1/true/yes/on or 0/false/no/off
    in any case, spaces around ignored; unset or empty is default; anything
    else raises InvalidArgumentError naming the variable and the value, as
    the library's own error for it does."""
    raw = os.environ.get(name, "")
    v = raw.strip().lower()
    if raw == "":
        return default
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise make_error(
        Result.INVALID_ARGUMENT,
        f"{name}={quote(raw)} cannot be read as a boolean: not one of 1/true/yes/on or 0/false/no/off",
    )


_SIZE_SHIFTS = {"K": 10, "M": 20, "G": 30, "T": 40}


def env_size(name: str, default: int) -> int:
    """The size setting name in bytes, read by the library's rule for sizes
    (core/settings.go, ParseSize): a whole number with an optional K, M, G
    or T (B, KB, KiB and the like alike, any case); unset or empty is
    default; anything else raises InvalidArgumentError naming the variable
    and the value."""
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    t = raw.strip().upper()
    if t.endswith("B"):
        t = t[:-1]
    if t.endswith("I"):
        t = t[:-1]
    shift = _SIZE_SHIFTS.get(t[-1:], 0)
    if shift:
        t = t[:-1]
    t = t.strip()
    if not t.isdigit():
        raise make_error(
            Result.INVALID_ARGUMENT, f"{name}={quote(raw)} cannot be read as a size (examples: 4096, 512M, 1G)")
    v = int(t) << shift
    if v >= 1 << 64:
        raise make_error(Result.INVALID_ARGUMENT, f"{name}={quote(raw)}: more than 2^64 bytes")
    return v


def int_text(v: int) -> str:
    """An int for a message: its digits, or its size in bits when that
    would take more than 64 characters (10**100000 has 100001 digits)."""
    if v.bit_length() <= 200:
        return str(v)
    return f"{'-' if v < 0 else ''}(an integer of {v.bit_length()} bits)"


_REPR = reprlib.Repr()
_REPR.maxstring = 64
_REPR.maxother = 64
_REPR.maxlong = 64


def brief(value) -> str:
    """value for a message, bounded whatever it is (Note [Bounded messages]):
    its type's name, then a str quoted by :func:`quote` (cut at 64
    characters with its length stated), an int by :func:`int_text`, and
    anything else as a repr cut at 64 characters (reprlib: a long list is
    not printed whole first), with its length when it has one:
    ``list [0, 1, 2, 3, 4, 5, ...] (100000 items)``."""
    kind = type(value).__name__
    if isinstance(value, str):
        return f"{kind} {quote(value)}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{kind} {int_text(value)}"
    try:
        text = _REPR.repr(value)
    except Exception:  # a repr that raises says nothing useful
        text = "<unprintable>"
    if len(text) > QUOTE_MAX_CHARS:
        text = text[:QUOTE_MAX_CHARS] + "…"
    try:
        n = len(value)
    except Exception:
        return f"{kind} {text}"
    unit = "bytes" if isinstance(value, (bytes, bytearray, memoryview)) else "items"
    return f"{kind} {text} ({n} {unit})"


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
