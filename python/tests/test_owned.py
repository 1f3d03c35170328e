"""How the package's objects own the library's (symmem._owned): closed once,
by the explicit call or when collected, never at interpreter exit; the same
rule for a Buffer's memory, a Group and a Handle."""

from __future__ import annotations

import gc
import subprocess
import sys
import uuid

import symmem
from symmem import _lib
from symmem._owned import Owned


def test_owned_closes_once_explicitly_or_when_collected():
    calls = []
    o = Owned(lambda *a: calls.append(a), 1, "two")
    assert o.alive
    assert o.take() == (1, "two") and not o.alive
    assert o.take() is None  # once
    del o
    gc.collect()
    assert calls == [], "taken: the collector does not close it again"

    o = Owned(lambda *a: calls.append(a), 3)
    del o
    assert calls == [(3,)], "dropped untaken: closed at once"


def test_owned_drops_the_errors_of_a_close_when_collected():
    def refuse(*_):
        raise RuntimeError("the library refused")

    o = Owned(refuse, 7)
    del o  # nothing raised, nothing printed by the unraisable hook
    gc.collect()


def test_owned_in_a_cycle_closes_when_the_cycle_is_collected():
    calls = []

    class Owner:
        pass

    a = Owner()
    a.me = a
    a.owned = Owned(calls.append, "cycle")
    del a
    gc.collect()
    assert calls == ["cycle"]


def test_nothing_is_closed_at_interpreter_exit():
    code = (
        "import sys\n"
        "from symmem._owned import Owned\n"
        "kept = Owned(lambda: sys.stdout.write('CLOSED\\n'))\n"
        "print('END')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["END"], p.stdout


def test_buffer_group_and_handle_follow_the_rule():
    lib = _lib.lib()
    g = symmem.Group("owned-" + uuid.uuid4().hex[:8], 0, 1, timeout=10)
    buf = symmem.empty(4096)
    h = symmem.rendezvous(buf, g)
    gp, hp = g.ptr, h.ptr
    assert lib.symmem_group_rank(gp) == 0 and lib.symmem_handle_rank(hp) == 0
    del h
    gc.collect()
    assert lib.symmem_handle_rank(hp) == -1, "a handle never released is released when collected"
    del g
    gc.collect()
    assert lib.symmem_group_rank(gp) == -1, "a group never destroyed is destroyed when collected"
    before = symmem.memory_stats(buf.device)["allocation.all.current"]
    del buf
    gc.collect()
    assert symmem.memory_stats(0)["allocation.all.current"] == before - 1, "an owning buffer is freed when collected"
    # The explicit calls close once and report nothing the second time.
    g = symmem.Group("owned-" + uuid.uuid4().hex[:8], 0, 1, timeout=10)
    buf = symmem.empty(4096)
    h = symmem.rendezvous(buf, g)
    for close in (h.release, g.destroy, buf.free):
        close()
        close()
    assert buf.freed and "released" in repr(h) and "destroyed" in repr(g)
