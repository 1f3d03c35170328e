"""Result codes, exception classes, and the per-thread last error."""

from __future__ import annotations

import builtins
import pickle
import threading

import pytest

import symmem
from symmem import _lib
from symmem._lib import check
from symmem.errors import Result, error_class, make_error


@pytest.mark.parametrize(
    "code, cls, builtin",
    [
        (Result.INVALID_ARGUMENT, symmem.InvalidArgumentError, ValueError),
        (Result.OUT_OF_MEMORY, symmem.OutOfMemoryError, MemoryError),
        (Result.INVALID_POINTER, symmem.InvalidPointerError, ValueError),
        (Result.INVALID_DEVICE, symmem.InvalidDeviceError, ValueError),
        (Result.BACKEND, symmem.BackendError, OSError),
        (Result.UNAVAILABLE, symmem.UnavailableError, RuntimeError),
        (Result.TIMEOUT, symmem.TimeoutError, builtins.TimeoutError),
        (Result.MISMATCH, symmem.MismatchError, ValueError),
        (Result.PEER, symmem.PeerError, ConnectionError),
        (Result.PERMISSION, symmem.PermissionError, builtins.PermissionError),
        (Result.INVALID_STATE, symmem.InvalidStateError, RuntimeError),
        (Result.INTERNAL, symmem.InternalError, RuntimeError),
        (Result.ABORTED, symmem.AbortedError, RuntimeError),
        (Result.INTERRUPTED, symmem.InterruptedError, builtins.InterruptedError),
    ],
)
def test_each_code_has_its_class(code, cls, builtin):
    assert error_class(code) is cls
    e = make_error(code, "symmem_x: what went wrong")
    assert isinstance(e, cls) and isinstance(e, symmem.SymmemError) and isinstance(e, builtin)
    assert e.code is code
    assert e.message == "symmem_x: what went wrong"
    assert code.name in str(e)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls and back.code == code and back.message == e.message


def test_unknown_code():
    e = make_error(99, "")
    assert type(e) is symmem.SymmemError
    assert e.code == 99
    assert e.message == "unknown result 99"


def test_strerror_for_every_code():
    seen = set()
    for code in Result:
        s = symmem.strerror(code)
        assert s and s not in seen
        seen.add(s)
    assert "99" in symmem.strerror(99)


def test_check_uses_the_last_error_message():
    lib = _lib.lib()
    lib.symmem_clear_last_error()
    rc = lib.symmem_empty_cache(12345)
    assert rc == Result.INVALID_DEVICE
    with pytest.raises(symmem.InvalidDeviceError) as info:
        check(rc, "symmem_empty_cache")
    assert info.value.message  # the library's own words
    check(Result.SUCCESS)


def test_copy_last_error_truncates_like_snprintf():
    lib = _lib.lib()
    lib.symmem_clear_last_error()
    assert lib.symmem_copy_last_error(None, 0) == 0
    lib.symmem_empty_cache(777)
    msg = lib.symmem_last_error_message()
    n = lib.symmem_copy_last_error(None, 0)
    assert n == len(msg) > 5
    import ctypes

    buf = ctypes.create_string_buffer(5)
    assert lib.symmem_copy_last_error(buf, 5) == n
    assert buf.value == msg[:4]
    lib.symmem_clear_last_error()
    assert lib.symmem_last_error() == 0 and lib.symmem_last_error_message() == b""


def test_last_error_is_per_thread():
    lib = _lib.lib()
    lib.symmem_clear_last_error()
    seen = {}

    def fail():
        lib.symmem_clear_last_error()
        lib.symmem_empty_cache(4242)
        seen["other"] = lib.symmem_last_error()

    t = threading.Thread(target=fail)
    t.start()
    t.join()
    assert seen["other"] == Result.INVALID_DEVICE
    assert lib.symmem_last_error() == Result.SUCCESS
