"""What libsymmem knows about itself and the machine (``python -m symmem``).

:func:`info` returns the library's own report (``symmem_info_json``: version,
backend and why, devices, peers, driver attributes, optional libraries,
socket directory, settings) with the Python package's part added. The
:func:`self_test` allocates, frees, and runs a 2-process group with a
rendezvous and a barrier.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List

from . import _lib
from ._version import __version__
from .errors import quote

__all__ = ["info", "self_test", "format_text"]


def _library_info() -> Dict[str, Any]:
    lib = _lib.lib()
    if not lib.has("symmem_info_json"):
        return {"error": f"{lib.path} has no symmem_info_json (an older library)"}
    n = int(lib.symmem_info_json(None, 0))
    buf = ctypes.create_string_buffer(n + 1)
    lib.symmem_info_json(ctypes.cast(buf, ctypes.c_void_p), n + 1)
    return json.loads(buf.value.decode())


def info() -> Dict[str, Any]:
    """The diagnostic report as a dict (what ``python -m symmem --json`` prints)."""
    out: Dict[str, Any] = {
        "package": {
            "version": __version__,
            "path": os.path.dirname(os.path.abspath(__file__)),
            "library_candidates": _lib.candidates(),
        }
    }
    try:
        out["package"]["library_loaded"] = str(_lib.lib().path)
        out.update(_library_info())
    except _lib.LibraryNotFoundError as exc:
        out["error"] = str(exc)
    return out


_RANK_SCRIPT = r"""
import sys, symmem
name, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with symmem.Group(name, rank, world, timeout=30) as g, symmem.empty(4096) as buf:
    with symmem.rendezvous(buf, g) as h:
        h.barrier()
        if symmem.backend_name() == "host":
            h.get_buffer(rank).write(bytes([rank + 1]))
            h.barrier()
            got = [h.get_buffer(r).read(0, 1)[0] for r in range(world)]
            assert got == [r + 1 for r in range(world)], got
        h.barrier()
print("rank", rank, "ok")
"""


def self_test() -> List[Dict[str, Any]]:
    """Runs the checks; each result is {"name", "ok", "detail", "seconds"}."""
    from . import allocator

    results: List[Dict[str, Any]] = []

    def step(name, fn):
        t0 = time.monotonic()
        try:
            detail = fn() or ""
            ok = True
        except Exception as exc:  # reported, not raised: this is a diagnostic
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        results.append({"name": name, "ok": ok, "detail": detail, "seconds": round(time.monotonic() - t0, 3)})
        return ok

    def alloc_free():
        p = allocator.alloc(1 << 20)
        allocator.free(p)
        allocator.validate(0)
        return f"1 MiB at {p:#x} on device 0, freed; invariants hold"

    def group():
        name = "selftest-" + uuid.uuid4().hex[:12]
        env = dict(os.environ)
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        env.setdefault("NVSHMEM_DISABLE_NVLS", "1")
        env["SYMMEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
        env["SYMMEM_LIBRARY"] = str(_lib.lib().path)
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = pkg_parent + os.pathsep + env.get("PYTHONPATH", "")
        # Each rank's output goes to a file, not a pipe: a rank that writes
        # more than a pipe holds before it joins would otherwise wait for a
        # reader while the other rank waits for it.
        outs = []
        with tempfile.TemporaryFile() as f0, tempfile.TemporaryFile() as f1:
            files = (f0, f1)
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", _RANK_SCRIPT, name, str(r), "2"],
                    env=env, stdout=files[r], stderr=subprocess.STDOUT,
                )
                for r in range(2)
            ]
            for p, f in zip(procs, files):
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                f.seek(0)
                outs.append((p.returncode, f.read().decode(errors="replace").strip()))
        bad = [f"rank {r}: exit {rc}: {out[-400:]}" for r, (rc, out) in enumerate(outs) if rc != 0]
        if bad:
            raise RuntimeError("; ".join(bad))
        return "2 processes: group, rendezvous, barrier (and peer reads on host)"

    if step("allocate and free", alloc_free):
        step("2-process group, rendezvous, barrier", group)
    return results


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def format_text(rep: Dict[str, Any]) -> str:
    """The report as the lines ``python -m symmem`` prints."""
    L: List[str] = []
    pkg = rep.get("package") or {}
    L.append(f"symmem package {pkg.get('version')} at {pkg.get('path')}")
    if "error" in rep:
        L.append(f"library: NOT FOUND\n{rep['error']}")
        return "\n".join(L)
    L.append(f"library {rep.get('version')} at {rep.get('library') or pkg.get('library_loaded')}")
    b = rep.get("backend") or {}
    L.append(f"backend: {b.get('name')} ({b.get('why')})")
    if b.get("error"):
        L.append(f"  ERROR: {b['error']}")
    for n in b.get("notes") or []:
        L.append(f"  note: {n}")
    L.append("devices:")
    for d in rep.get("devices") or []:
        L.append(f"  {d['index']}: {d['name']}, {_gib(d['total_memory'])} total, {_gib(d['free_memory'])} free"
                 + (f" (error: {d['error']})" if d.get("error") else ""))
        if d.get("fabric_domain"):
            L.append(f"     fabric handles: on, NVLink domain {d['fabric_domain']}")
        elif d.get("fabric_note"):
            L.append(f"     fabric handles: off ({d['fabric_note']}); peers are mapped through POSIX file descriptors")
    m = rep.get("machine") or {}
    if m:
        what = f"host {m.get('hostname')}, boot id {m.get('boot_id')}"
        if m.get("simulated"):
            what = f"machine {m['simulated']!r} (SYMMEM_MACHINE_ID) on " + what
        L.append(f"machine: {what}" + (f" (ERROR: {m['error']})" if m.get("error") else ""))
    # The host backend needs none of the GPU libraries: what is missing
    # there is said as such, without install advice.
    host = b.get("name") == "host"
    unneeded = "not needed for the host backend"
    drv = rep.get("cuda_driver") or {}
    if drv.get("error") and host:
        L.append(f"cuda driver: {unneeded} (not found; SYMMEM_LIBCUDA names it)")
    elif drv.get("error"):
        L.append(f"cuda driver: not available: {drv['error']}")
    else:
        L.append(f"cuda driver: {drv.get('driver_version')} ({drv.get('library')})")
        for d in drv.get("devices") or []:
            if d.get("error"):
                L.append(f"  gpu {d['index']}: error: {d['error']}")
                continue
            yn = lambda v: "yes" if v else "no"  # noqa: E731
            L.append(f"  gpu {d['index']}: {d['name']}, {_gib(d['total_memory'])}, compute capability "
                     f"{d['compute_capability']}, {d['uuid']}")
            L.append(f"         VMM {yn(d['vmm'])}, POSIX fd {yn(d['posix_fd'])}, fabric {yn(d['fabric'])}, "
                     f"multicast {yn(d['multicast'])} (queried, never used)")
        for p in drv.get("peers") or []:
            L.append(f"  peer {p['from']} -> {p['to']}: access {'yes' if p['access'] else 'no'}, link {p['link']}")
    L.append("libraries:")
    for name, v in sorted((rep.get("libraries") or {}).items()):
        if isinstance(v, dict) and host and not v.get("found"):
            desc = f"{unneeded} (not found; SYMMEM_LIB{name.upper()} names it)"
        elif isinstance(v, dict):
            keys = sorted(v, key=lambda k: (k != "found", k))
            desc = ", ".join(f"{k} {v[k]}" for k in keys)
        else:
            desc = str(v)
        L.append(f"  {name}: {desc}")
    s = rep.get("socket_dir") or {}
    L.append(f"socket directory: {s.get('path')} (owner uid {s.get('owner_uid')}, mode {s.get('mode')})"
             + (f" ERROR: {s['error']}" if s.get("error") else ""))
    L.append("settings (SYMMEM_* variables set):")
    if not rep.get("settings"):
        L.append("  none")
    for st in rep.get("settings") or []:
        # Name and value as the library's messages show them: cut at 64
        # characters (Note [Bounded messages]); the JSON report keeps them whole.
        name = st["name"] if len(st["name"]) <= 64 else quote(st["name"])
        line = f"  {name}={quote(st['value'])}: {st['kind']}, read as {st['reading']} (by {st['read_by']})"
        if st.get("error"):
            line += f"  ERROR: {st['error']}"
        L.append(line)
    return "\n".join(L)
