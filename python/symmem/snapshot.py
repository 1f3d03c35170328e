"""A picture of the heap: snapshots in the format of PyTorch's memory
snapshots (``torch.cuda.memory._snapshot()``), so that PyTorch's visualiser
(``torch.cuda._memory_viz``: segment_plot, trace_plot; and the viewer at
pytorch.org/memory_viz, which opens pickles such as ``dump_snapshot`` writes)
draws libsymmem's segments and blocks, and the allocation history when
recording is on. Needs neither torch nor numpy; :mod:`symmem.torch` re-exports
these functions under torch's names.

Format (per torch): ``{"segments": [segment...], "device_traces": [[event...]
per device]}`` where a segment is ``{device, address, total_size,
allocated_size, active_size, requested_size, stream, segment_type,
segment_pool_id, is_expandable, frames, blocks}``, a block ``{address, size,
requested_size, state, frames}`` (state "active_allocated" or "inactive"),
an event ``{action, addr, size, stream, time_us, frames}`` (action alloc,
free_requested, free_completed, segment_alloc, segment_free), and a frame
``{filename, line, name}``, innermost first.

What differs from PyTorch: frames are Python frames only (``stacks="all"``
gives the same; libsymmem does not unwind C++); a free's event carries no
stack; no block is ever "active_pending_free" (frees complete at once on
their stream, see symmem.h).
"""

from __future__ import annotations

import ctypes
import json
import pickle
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple

from . import _lib
from ._lib import check
from .errors import C_SIZE, Result, brief, int_arg, make_error

__all__ = ["memory_snapshot", "record_memory_history", "dump_snapshot", "segment_svg"]

Frame = Dict[str, Any]

_frames_lock = threading.Lock()
_frames_by_key: Dict[Tuple, int] = {}
_frames_by_id: Dict[int, List[Frame]] = {0: []}
_context_enabled = False
_keep_history = True
_hook = None  # the ctypes callback, kept alive while installed

_CONTEXT_FN = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p)


def _capture(_user) -> int:
    """The context hook: this thread's Python stack, interned; 0 on any error."""
    try:
        if not _context_enabled:
            return 0
        f = sys._getframe(1)
        key = []
        while f is not None:
            key.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
            f = f.f_back
        k = tuple(key)
        with _frames_lock:
            cid = _frames_by_key.get(k)
            if cid is None:
                cid = len(_frames_by_id)
                _frames_by_key[k] = cid
                _frames_by_id[cid] = [{"filename": fn, "line": ln, "name": nm} for fn, ln, nm in k]
            return cid
    except Exception:  # never raise into the allocator
        return 0


def record_memory_history(
    enabled: Optional[str] = "all",
    context: Optional[str] = "all",
    stacks: str = "all",
    max_entries: int = 100_000,
    device: Any = None,
) -> None:
    """Start (or stop, ``enabled=None``) recording, as
    ``torch.cuda.memory._record_memory_history`` does.

    enabled: None (off), "state" (stacks of live blocks only) or "all"
    (stacks and the history of events, the last max_entries kept).
    context: None (no stacks) or "state"/"alloc"/"all" (a Python stack per
    allocation). stacks: "python" or "all" (both give Python frames).
    device is accepted for torch's signature; recording covers every device.
    """
    global _context_enabled, _keep_history, _hook
    if enabled not in (None, "state", "all"):
        raise make_error(Result.INVALID_ARGUMENT, f"record_memory_history: enabled={brief(enabled)}: None, 'state' or 'all'")
    if context not in (None, "state", "alloc", "all"):
        raise make_error(Result.INVALID_ARGUMENT, f"record_memory_history: context={brief(context)}: None, 'state', 'alloc' or 'all'")
    if stacks not in ("python", "all"):
        raise make_error(Result.INVALID_ARGUMENT, f"record_memory_history: stacks={brief(stacks)}: 'python' or 'all'")
    max_entries = int_arg(max_entries, "max_entries", "record_memory_history", C_SIZE)
    if max_entries <= 0:
        raise make_error(Result.INVALID_ARGUMENT, f"record_memory_history: max_entries={max_entries} must be positive")
    lib = _lib.lib()
    if enabled is None:
        check(lib.symmem_record_history(0), "symmem_record_history")
        lib.symmem_set_context_hook(None, None)
        _context_enabled, _hook = False, None
        return
    _keep_history = enabled == "all"
    _context_enabled = context is not None
    if _hook is None:
        _hook = _CONTEXT_FN(_capture)
    lib.symmem_set_context_hook(ctypes.cast(_hook, ctypes.c_void_p), None)
    check(lib.symmem_record_history(min(max_entries, 1 << 26)), "symmem_record_history")


def _library_snapshot() -> Dict[str, Any]:
    lib = _lib.lib()
    size = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(size)
        lib.symmem_clear_last_error()
        n = int(lib.symmem_memory_snapshot_json(ctypes.cast(buf, ctypes.c_void_p), size))
        if n == 0:
            check(int(lib.symmem_last_error()) or Result.INTERNAL, "symmem_memory_snapshot_json")
        if n < size:
            return json.loads(buf.value.decode())
        size = n + (n >> 2) + 1024  # grew between the calls: try again, larger


def _frames(cid: int) -> List[Frame]:
    with _frames_lock:
        return _frames_by_id.get(cid, [])


def memory_snapshot() -> Dict[str, Any]:
    """The heap of every device, as ``torch.cuda.memory._snapshot()`` gives
    PyTorch's (see the module docstring for the format)."""
    raw = _library_snapshot()
    segments = []
    for s in raw["segments"]:
        blocks = []
        for b in s["blocks"] or []:
            blocks.append({
                "address": b["address"],
                "size": b["size"],
                "requested_size": b["requested_size"],
                "state": b["state"],
                "frames": _frames(b["context"]),
            })
        segments.append({
            "device": s["device"],
            "address": s["address"],
            "total_size": s["total_size"],
            "allocated_size": s["allocated_size"],
            "active_size": s["active_size"],
            "requested_size": s["requested_size"],
            "stream": s["stream"],
            "segment_type": s["segment_type"],
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": blocks,
        })
    traces = []
    for dev in raw["device_traces"]:
        events = []
        if _keep_history:
            for e in dev:
                events.append({
                    "action": e["action"],
                    "addr": e["addr"],
                    "size": e["size"],
                    "stream": e["stream"],
                    "time_us": e["time_us"],
                    "frames": _frames(e["context"]),
                })
        traces.append(events)
    return {"segments": segments, "device_traces": traces, "allocator_settings": {"allocator": "libsymmem"}}


def dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickles memory_snapshot() to filename, as
    ``torch.cuda.memory._dump_snapshot`` does: drag the file onto
    pytorch.org/memory_viz, or give it to ``python -m torch.cuda._memory_viz``."""
    with open(filename, "wb") as f:
        pickle.dump(memory_snapshot(), f)


_PALETTE = ["#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f", "#edc949", "#af7aa1", "#ff9da7", "#9c755f"]


def _fmt_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def segment_svg(snapshot: Dict[str, Any], device: int = 0, width: int = 960, title: str = "") -> str:
    """A picture of device's segments without a browser or torch: one row
    per segment (scaled to the largest), allocated blocks in colour (the
    bytes asked for) with the rounding in dark red, free space white. What
    torch.cuda._memory_viz.segment_plot shows interactively, as a static SVG."""
    segs = sorted((s for s in snapshot["segments"] if s["device"] == device), key=lambda s: s["address"])
    label_w, row_h, gap, top = 300, 22, 6, 40
    bar_w = width - label_w - 20
    biggest = max([s["total_size"] for s in segs] + [1])
    height = top + len(segs) * (row_h + gap) + 50
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    reserved = sum(s["total_size"] for s in segs)
    asked = sum(b["requested_size"] for s in segs for b in s["blocks"] if b["state"] == "active_allocated")
    head = title or f"libsymmem heap, device {device}"
    out.append(f'<text x="10" y="20" font-size="14">{head}: {len(segs)} segments, {_fmt_size(reserved)} reserved, '
               f'{_fmt_size(asked)} in use</text>')
    for i, s in enumerate(segs):
        y = top + i * (row_h + gap)
        scale = bar_w / biggest
        out.append(f'<text x="10" y="{y + 15}">{s["address"]:#x} {_fmt_size(s["total_size"]):>9} {s["segment_type"]}</text>')
        out.append(f'<rect x="{label_w}" y="{y}" width="{max(1.0, s["total_size"] * scale):.2f}" height="{row_h}" '
                   f'fill="white" stroke="black"/>')
        for b in s["blocks"]:
            if b["state"] != "active_allocated":
                continue
            x = label_w + (b["address"] - s["address"]) * scale
            colour = _PALETTE[(b["address"] // 512) % len(_PALETTE)]
            w_req = max(0.5, b["requested_size"] * scale)
            out.append(f'<rect x="{x:.2f}" y="{y + 1}" width="{w_req:.2f}" height="{row_h - 2}" fill="{colour}">'
                       f'<title>{b["address"]:#x}: {b["requested_size"]} bytes asked, block {b["size"]}</title></rect>')
            lost = (b["size"] - b["requested_size"]) * scale
            if lost >= 0.5:
                out.append(f'<rect x="{x + w_req:.2f}" y="{y + 1}" width="{lost:.2f}" height="{row_h - 2}" fill="#8b0000"/>')
    y = top + len(segs) * (row_h + gap) + 20
    out.append(f'<text x="10" y="{y}">colour: an allocated block (bytes asked for); dark red: rounding; white: free '
               f'(reusable on its stream)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
