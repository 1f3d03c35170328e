"""No quiet fallbacks: what a user asked for explicitly either happens or
fails saying why.

- SYMMEM_LIBCUDA set to a driver that does not load: with SYMMEM_BACKEND
  unset every call fails naming the variable and the loader's error; with
  SYMMEM_BACKEND=auto the host backend opens after one warning on stderr
  (Note [Explicit settings are orders] in core/backend.go).
- timeout: None and 0 mean the default (the group's timeout, else
  SYMMEM_TIMEOUT_MS or 300 s), as timeout_ms 0 does in C; a negative timeout
  is InvalidArgumentError, never read as 300 s.
- Reading a paused buffer names the paused tag instead of faulting.
- `python -m symmem | head -3` ends without a BrokenPipeError traceback.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import uuid

import pytest

import symmem

PROBE = r"""
import symmem
try:
    symmem.free(symmem.alloc(4096))
    print("backend", symmem.backend_name())
except symmem.SymmemError as e:
    print("error", type(e).__name__, e.message)
"""

BAD_DRIVER = "/nonexistent/libcuda.so.1"


def probe(env_update, code=PROBE):
    env = {k: v for k, v in os.environ.items() if k not in ("SYMMEM_BACKEND", "SYMMEM_LIBCUDA", "SYMMEM_QUIET")}
    env.update(env_update)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_an_unloadable_driver_path_fails_without_backend_choice():
    p = probe({"SYMMEM_LIBCUDA": BAD_DRIVER})
    assert p.returncode == 0, p.stderr
    out = p.stdout.strip()
    assert out.startswith("error UnavailableError"), out
    assert "SYMMEM_LIBCUDA is set" in out and BAD_DRIVER in out, out
    assert "No such file or directory" in out, out  # the loader's own error
    assert "SYMMEM_BACKEND=auto" in out, out  # the way to accept a fallback


def test_an_unloadable_driver_path_with_auto_warns_once():
    p = probe({"SYMMEM_LIBCUDA": BAD_DRIVER, "SYMMEM_BACKEND": "auto"}, PROBE + "symmem.free(symmem.alloc(64))\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "backend host", p.stdout
    warnings = [l for l in p.stderr.splitlines() if "SYMMEM_LIBCUDA" in l]
    assert len(warnings) == 1, p.stderr
    assert warnings[0].startswith("symmem: warning: SYMMEM_LIBCUDA is set"), warnings
    assert BAD_DRIVER in warnings[0] and "No such file or directory" in warnings[0], warnings
    # backend_notes keep it too; SYMMEM_QUIET silences the warning only.
    q = probe({"SYMMEM_LIBCUDA": BAD_DRIVER, "SYMMEM_BACKEND": "auto", "SYMMEM_QUIET": "1"},
              PROBE + "print(symmem.backend_notes())\n")
    assert "SYMMEM_LIBCUDA" not in q.stderr, q.stderr
    assert "SYMMEM_LIBCUDA is set" in q.stdout, q.stdout


def test_an_explicit_host_backend_does_not_load_the_driver():
    p = probe({"SYMMEM_LIBCUDA": BAD_DRIVER, "SYMMEM_BACKEND": "host"})
    assert p.stdout.strip() == "backend host" and "SYMMEM_LIBCUDA" not in p.stderr, (p.stdout, p.stderr)


@pytest.mark.parametrize("timeout", [-1, -0.001, -math.inf, math.nan])
def test_negative_timeouts_are_refused(timeout):
    name = "timeouts-" + uuid.uuid4().hex[:8]
    with pytest.raises(symmem.InvalidArgumentError, match=r"symmem\.Group: timeout .* s: a timeout is a number of seconds >= 0"):
        symmem.Group(name, 0, 1, timeout=timeout)
    with symmem.Group(name, 0, 1, timeout=10) as g, symmem.empty(4096) as buf, symmem.rendezvous(buf, g) as h:
        with pytest.raises(symmem.InvalidArgumentError, match=r"symmem\.Handle\.barrier: timeout"):
            h.barrier(timeout=timeout)
        with pytest.raises(symmem.InvalidArgumentError, match=r"symmem\.Handle\.wait_signal: timeout"):
            h.wait_signal(0, timeout=timeout)


def test_zero_timeout_is_the_default():
    # 0 is the group's timeout (here 10 s), not "do not wait": a put then a
    # wait with timeout=0 passes, and a barrier of one rank too.
    with symmem.Group("timeouts-" + uuid.uuid4().hex[:8], 0, 1, timeout=0) as g, symmem.empty(4096) as buf:
        with symmem.rendezvous(buf, g) as h:
            h.put_signal(0, channel=1)
            h.wait_signal(0, channel=1, timeout=0)
            h.barrier(timeout=0)


def test_reading_a_paused_buffer_names_the_tag():
    tag = "paused-read-" + uuid.uuid4().hex[:6]
    with symmem.region(tag):
        buf = symmem.empty(4096)
    buf.write(b"abc")
    symmem.pause(tag)
    try:
        calls = [
            ("read", lambda: buf.read(0, 3)),
            ("write", lambda: buf.write(b"x")),
            ("fill", lambda: buf.fill(1)),
            ("copy", lambda: symmem.copy(buf.ptr, buf.ptr + 8, 8)),
        ]
        if buf.kind == "host":  # CPU-addressable memory: the views a CPU read would fault through
            calls += [("memoryview", lambda: buf.memoryview()),
                      ("__array_interface__", lambda: buf.__array_interface__)]
        for what, call in calls:
            with pytest.raises(symmem.InvalidStateError) as e:
                call()
            assert f'tag "{tag}", which is paused' in e.value.message, (what, e.value.message)
            assert "faulted" not in e.value.message, (what, e.value.message)
    finally:
        symmem.resume(tag)
    assert buf.read(0, 3) == b"\0\0\0"  # no backup: zero after the resume
    if buf.kind == "host":
        assert bytes(buf.memoryview()[:3]) == b"\0\0\0"
    buf.free()


def test_python_m_symmem_into_a_closed_pipe():
    env = dict(os.environ)
    # The reader is gone before the first line: every write is EPIPE.
    p = subprocess.Popen([sys.executable, "-m", "symmem", "--no-self-test"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    p.stdout.close()
    _, err = p.communicate(timeout=120)
    err = err.decode(errors="replace")
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert p.returncode == 141, (p.returncode, err)
    # And as a reader types it: the first three lines, no traceback.
    sh = subprocess.run(["sh", "-c", f"'{sys.executable}' -m symmem | head -3"], env=env, capture_output=True,
                        text=True, timeout=120)
    assert len(sh.stdout.splitlines()) == 3, sh.stdout
    assert "Traceback" not in sh.stderr and "BrokenPipeError" not in sh.stderr, sh.stderr


@pytest.mark.parametrize("redirect, why", [
    (">&-", "standard output is closed"),
    ("> /dev/full", "No space left on device"),
    ("1< /dev/null", "Bad file descriptor"),
])
def test_python_m_symmem_with_stdout_closed_or_unwritable(redirect, why):
    """Standard output closed, full or opened for reading: one line on
    stderr saying so and status 1, never a traceback."""
    if "/dev/full" in redirect and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    p = subprocess.run(["sh", "-c", f"'{sys.executable}' -m symmem --no-self-test {redirect}"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1, (p.returncode, p.stderr)
    lines = [line for line in p.stderr.splitlines() if line.startswith("python -m symmem")]
    assert len(lines) == 1 and why in lines[0] and "the report was not printed" in lines[0], p.stderr
    assert "Traceback" not in p.stderr, p.stderr
