"""Failure paths of the Python package: timeouts that saturate and
default to SYMMEM_TIMEOUT_MS, memoryviews released with their handle or
buffer, strerror of unknown codes."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
import uuid

import pytest

import symmem
from symmem import Result
from symmem.group import _INT64_MAX, _timeout_ms


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def test_timeout_conversion_saturates():
    assert _timeout_ms(None) == 0  # the library's default
    assert _timeout_ms(0) == 0  # 0 is the default too, as timeout_ms 0 in C
    with pytest.raises(symmem.InvalidArgumentError, match="a timeout is a number of seconds >= 0"):
        _timeout_ms(-3)  # refused, never read as the default
    assert _timeout_ms(1.5) == 1500
    assert _timeout_ms(1e-9) == 1
    for huge in (9.3e15, 1e300, float("inf"), 2**70):
        assert _timeout_ms(huge) == _INT64_MAX, huge
    with pytest.raises(symmem.InvalidArgumentError):
        _timeout_ms(float("nan"))


def test_huge_timeouts_do_not_wrap(host_backend, symmetric):
    # Host backend: the wait runs on this thread (on cuda it is enqueued on
    # the stream, ahead of the put, which would then never run).
    # A wrapped timeout would be under a millisecond: the wait below, which
    # a thread satisfies 200 ms later, would time out.
    if symmem.backend_name() != "host":
        # On cuda the wait is queued on the stream and returns at once, and
        # the put queued behind it would never run: the device stays stuck
        # for every later test of this process (seen on the fake driver).
        pytest.skip("a host-side wait: on cuda, signals wait on the stream")
    import threading

    with symmem.Group(unique("huge"), 0, 1, timeout=float("inf")) as g, symmem.empty(4096) as buf:
        with symmem.rendezvous(buf, g) as h:
            t = threading.Timer(0.2, h.put_signal, args=(0,))
            t.start()
            t0 = time.monotonic()
            h.wait_signal(0, timeout=1e300)
            assert time.monotonic() - t0 >= 0.15
            t.join()
            h.put_signal(0)
            h.wait_signal(0, timeout=2**80)


def test_default_timeout_is_the_environment_variable(symmetric):
    """Group(timeout=None) takes SYMMEM_TIMEOUT_MS (Python's own default no
    longer overrides it)."""
    code = (
        "import symmem, time, sys\n"
        "t0 = time.monotonic()\n"
        "try:\n"
        f"    symmem.Group({unique('envto')!r}, 0, 2)\n"
        "except symmem.TimeoutError as e:\n"
        "    print('TIMEOUT', round(time.monotonic() - t0, 3), e.message)\n"
    )
    env = dict(os.environ, SYMMEM_TIMEOUT_MS="700")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("TIMEOUT"), out.stdout + out.stderr
    took = float(out.stdout.split()[1])
    assert 0.5 < took < 30, took
    assert "700ms" in out.stdout


def test_peer_memoryview_after_release_raises(host_backend, symmetric):
    with symmem.Group(unique("mvrel"), 0, 1, timeout=10) as g, symmem.empty(256) as buf:
        h = symmem.rendezvous(buf, g)
        view = h.get_buffer(0)
        mv = view.memoryview()
        pad = h.get_signal_pad(0).memoryview()
        mv[0] = 7
        assert buf.read(0, 1) == b"\x07"
        h.release()
        with pytest.raises(ValueError):
            mv[0] = 1  # released, not a write into unmapped memory
        with pytest.raises(ValueError):
            pad[0]
        with pytest.raises(symmem.InvalidStateError):
            view.memoryview()
        with pytest.raises(symmem.InvalidStateError):
            view.read()
        assert "released" in repr(view)
        assert buf.read(0, 1) == b"\x07"


def test_exported_memoryview_blocks_release(host_backend, symmetric):
    with symmem.Group(unique("mvexp"), 0, 1, timeout=10) as g, symmem.empty(256) as buf:
        h = symmem.rendezvous(buf, g)
        mv = h.get_buffer(0).memoryview()
        exported = pickle.PickleBuffer(mv)  # holds a buffer of mv (as numpy.frombuffer does)
        with pytest.raises(symmem.InvalidStateError) as info:
            h.release()
        assert "exported" in info.value.message
        assert h._ptr is not None  # still alive: the export may still be used
        mv[0] = ord("z")
        assert bytes(exported.raw()[:1]) == b"z" and buf.read(0, 1) == b"z"
        exported.release()
        h.release()
        with pytest.raises(ValueError):
            mv[0]


def test_exported_memoryview_blocks_free(host_backend):
    buf = symmem.empty(64)
    mv = buf.memoryview()
    exported = pickle.PickleBuffer(mv)
    with pytest.raises(symmem.InvalidStateError):
        buf.free()
    assert not buf.freed
    exported.release()
    buf.free()
    assert buf.freed
    with pytest.raises(ValueError):
        mv[0]


def test_strerror_of_unknown_codes():
    assert symmem.strerror(1000) == "unknown result 1000"
    assert symmem.strerror(-7) == "unknown result -7"
    assert symmem.strerror(Result.TIMEOUT) == "timed out"
