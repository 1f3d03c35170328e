"""Group.abort and Ctrl-C (include/symmem.h: symmem_group_abort,
symmem_set_interrupt_fd).

Every rank is a process of its own (tests/_stuck_workers.py). A wait whose
peer never comes is ended by Group.abort from another thread (AbortedError,
and every later call too), and by SIGINT: KeyboardInterrupt within 0.5 s,
the group left aborted or, while it forms, not made at all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import symmem

WORKER = str(Path(__file__).resolve().parent / "_stuck_workers.py")
HOST = symmem.backend_name() == "host"


def _start(mode: str, rank: int, name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, WORKER, mode, str(rank), name], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _name(what: str) -> str:
    return f"pytest-{what}-{os.getpid()}-{time.monotonic_ns() % 10**9}"


def _wait_line(p: subprocess.Popen, word: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith(word):
            return line
    raise AssertionError(f"no {word} line; the rank printed:\n{''.join(seen)}")


def _interrupt(p: subprocess.Popen) -> None:
    """SIGINT once the rank waits; KeyboardInterrupt within 0.5 s."""
    _wait_line(p, "READY")
    time.sleep(0.5)  # well into the wait, past its fast part
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    line = _wait_line(p, "KEYBOARDINTERRUPT", timeout=30)
    late = float(line.split()[1]) - sent
    assert late < 0.5, f"KeyboardInterrupt came {late:.3f} s after SIGINT"


@pytest.mark.parametrize("rank", [0, 1])
def test_ctrl_c_while_the_group_forms(rank):
    p = _start("join", rank, _name("join"))
    try:
        _interrupt(p)
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
        p.wait()


@pytest.mark.skipif(not HOST, reason="a barrier waits on the host only on the host backend (on cuda it is enqueued)")
def test_ctrl_c_in_a_barrier_whose_peer_never_comes():
    name = _name("barrier")
    ps = [_start("barrier", r, name) for r in range(2)]
    try:
        _interrupt(ps[0])
        assert _wait_line(ps[0], "RESULT").strip() == "RESULT ok"
        assert ps[0].wait(timeout=30) == 0
    finally:
        for p in ps:
            p.kill()
            p.wait()


@pytest.mark.parametrize("peer", ["killed", "stopped"])
def test_abort_releases_a_barrier_whose_peer_is_gone(peer):
    name = _name("abort")
    ps = [_start("abort-" + peer, r, name) for r in range(2)]
    try:
        line = _wait_line(ps[0], "WAITED").split()
        waited, outcome = float(line[1]), line[2]
        assert waited < 0.3 + 5, f"the wait ended {waited:.2f} s after it began (abort after 0.3 s)"
        want = {"aborted", "peer"} if (HOST and peer == "killed") else ({"aborted"} if HOST else {"returned"})
        assert outcome in want
        assert _wait_line(ps[0], "RESULT").strip() == "RESULT ok"
        assert ps[0].wait(timeout=30) == 0
    finally:
        for p in ps:
            p.kill()
            p.wait()


def test_abort_through_symmem_torch_without_torch():
    """symmem.torch.abort takes a symmem.Group as is (no torch needed): the
    group is aborted, later calls raise AbortedError, destroy works."""
    import symmem.torch as st

    g = symmem.Group(_name("torch-abort"), 0, 1)
    buf = symmem.empty(4096)
    h = g.rendezvous(buf)
    st.abort(g)
    with pytest.raises(symmem.AbortedError):
        h.barrier()
    with pytest.raises(symmem.AbortedError):
        g.rendezvous(buf)
    g.abort()  # again: a no-op
    h.release()
    g.destroy()
    g.abort()  # destroyed: a no-op


# SYMMEM_PYTHON_INTERRUPTS is a boolean setting read by the boolean rule of
# every setting; each value runs in a fresh process (the set-up is once per
# process).
_INTERRUPTS_PROBE = r"""
import signal, symmem
from symmem import _lib
try:
    on = _lib.install_interrupts()
except symmem.InvalidArgumentError as e:
    print("ERROR", e.message)
else:
    print("ON" if on else "OFF", signal.set_wakeup_fd(-1) != -1)
"""


@pytest.mark.parametrize("value, want", [
    ("0", "OFF False"), ("off", "OFF False"), ("False", "OFF False"), (" no ", "OFF False"),
    ("1", "ON True"), ("on", "ON True"), ("YES", "ON True"), ("", "ON True"),
])
def test_python_interrupts_setting_reads_as_a_boolean(value, want):
    env = dict(os.environ, SYMMEM_PYTHON_INTERRUPTS=value)
    env.pop("SYMMEM_QUIET", None)
    p = subprocess.run([sys.executable, "-c", _INTERRUPTS_PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == want, (value, p.stdout, p.stderr)
    assert "SYMMEM_PYTHON_INTERRUPTS" not in p.stderr, p.stderr  # no warning calls it ignored


def test_python_interrupts_setting_that_is_no_boolean_fails_the_group():
    env = dict(os.environ, SYMMEM_PYTHON_INTERRUPTS="sometimes")
    code = _INTERRUPTS_PROBE + "\ntry:\n    symmem.Group('pi', 0, 1, timeout=5)\nexcept symmem.InvalidArgumentError as e:\n    print('GROUP', e.message)\n"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    want = 'SYMMEM_PYTHON_INTERRUPTS="sometimes" cannot be read as a boolean'
    assert lines[0].startswith("ERROR ") and want in lines[0], p.stdout
    assert lines[1].startswith("GROUP ") and want in lines[1], p.stdout
