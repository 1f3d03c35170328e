"""The per-call paths: symmem._calls (Note [The call module] in
symmem/_lib.py) where make built it, ctypes where it is missing or
SYMMEM_PYTHON_EXTENSION is off, both giving the same results; and
symmem.torch's rendezvous again (Note [Rendezvous again]), on the host
backend.
"""

from __future__ import annotations

import glob
import os
import uuid

import pytest

import symmem
from symmem import _lib
from _mp import run_ranks
import _calls_workers as cw

PACKAGE = os.path.dirname(symmem.__file__)


def _built() -> bool:
    return bool(glob.glob(os.path.join(PACKAGE, "_calls*.so")))


def _check(results, extension: bool, reason: str = ""):
    for rank, res in enumerate(results):
        assert res["extension"] is extension, res
        assert reason in res["reason"], res
        assert res["sum"] == [3, 5, 7, 9], res
        assert "timed out" in res["timeout"] or "timeout" in res["timeout"], res


@pytest.mark.usefixtures("symmetric", "host_backend")
def test_calls_through_the_call_module_where_it_was_built():
    if not _built():
        pytest.skip(f"no symmem/_calls*.so in {PACKAGE}: `make build` makes it where Python's headers are")
    _check(run_ranks(cw.barrier_signal_collective, 2, f"cm{uuid.uuid4().hex[:8]}", False), True)


@pytest.mark.usefixtures("symmetric", "host_backend")
def test_calls_through_ctypes_when_the_setting_is_off():
    res = run_ranks(cw.barrier_signal_collective, 2, f"cs{uuid.uuid4().hex[:8]}", False,
                    env=lambda r: {"SYMMEM_PYTHON_EXTENSION": "0"})
    _check(res, False, "SYMMEM_PYTHON_EXTENSION is off")


@pytest.mark.usefixtures("symmetric", "host_backend")
def test_calls_through_ctypes_when_the_module_is_missing():
    res = run_ranks(cw.barrier_signal_collective, 2, f"cx{uuid.uuid4().hex[:8]}", True)
    _check(res, False, "symmem._calls cannot be imported")


def test_call_module_links_neither_the_library_nor_cuda():
    import shutil
    import subprocess

    mods = glob.glob(os.path.join(PACKAGE, "_calls*.so"))
    if not mods:
        pytest.skip("the call module was not built")
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("no readelf to list the module's needed libraries")
    for m in mods:
        dyn = subprocess.run([readelf, "-d", m], capture_output=True, text=True, check=True).stdout
        needed = [line.split("[")[1].rstrip("]") for line in dyn.splitlines() if "(NEEDED)" in line]
        assert not [n for n in needed if "symmem" in n or "cuda" in n], (m, needed)


def test_call_module_refuses_bad_arguments_without_crashing():
    if not _built():
        pytest.skip("the call module was not built")
    from symmem import _calls

    calls = _lib.calls()
    if not calls.extension:
        pytest.skip(f"the call module is not in use: {_lib.calls_fallback_reason}")
    with pytest.raises(TypeError, match=r"collective takes 9 arguments \(2 given\)"):
        _calls.collective(1, 2)
    with pytest.raises(TypeError, match="an address must be an int or None, not str"):
        _calls.barrier("handle", 0, 0, 0)
    with pytest.raises(OverflowError):
        _calls.put_signal(0, 1 << 40, 0, 0)
    with pytest.raises(ValueError, match="address 0 is NULL"):
        _calls.bind(0, 1, 2, 3, 4, 5, 6)
    with pytest.raises(TypeError, match=r"collective_from takes 10 arguments \(9 given\)"):
        _calls.collective_from(*range(9))
    # An input outside the block on the host backend: the library's refusal,
    # as through ctypes (a NULL handle first).
    rc = _calls.collective_from(None, 0, 0, 0, 1, None, None, 0, 0, None)
    assert rc == symmem.Result.INVALID_ARGUMENT, rc
    # A NULL handle is the library's error, as through ctypes.
    rc = _calls.barrier(None, 0, 0, None)
    assert rc == symmem.Result.INVALID_ARGUMENT, rc
    p = symmem.alloc(64)
    try:
        assert calls.is_symmem(p) and calls.is_symmem(p + 63)
        assert not calls.is_symmem(id(object())) and not calls.is_symmem(None)
    finally:
        symmem.free(p)


@pytest.mark.usefixtures("host_backend")
def test_torch_rendezvous_again_returns_the_agreed_handle(tmp_path):
    pytest.importorskip("torch", reason="PyTorch is not installed: the rendezvous-again test needs it")
    results = run_ranks(cw.rendezvous_again, 2, str(tmp_path / "pg"), timeout=240)
    r0 = results[0]
    assert r0["same_handle"] is True and r0["again_s"] < 5, r0
    assert r0["alive_after_one_release"] is True, r0
    for res in results:
        assert res["released_with_the_last"] is True and res["fresh_after_release"] is True, res
        assert res["again_by_group"] is True and res["fresh_after_destroy_group"] is True, res
