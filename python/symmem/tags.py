"""Tags, pause and resume (include/symmem.h, "Tags and pause").

Allocations made on a thread inside ``with region(tag)`` carry the tag; a
tag's memory can then be given back whole and taken again at the same
addresses::

    with symmem.region("weights", backup=True):
        w = symmem.alloc(1 << 30)
    symmem.pause("weights")      # physical memory released, w stays reserved
    symmem.resume("weights")     # same address, contents restored

Without ``backup=True`` the contents are ZERO after a resume. The host copy
is pinned memory, pinned ahead of the first pause (``backup="pageable"``: an
anonymous mapping the kernel may reclaim). Memory that a
rendezvous shared with other processes is paused collectively:
``symmem.pause(tag, group=g)`` on every rank of ``g``.

A region is per thread (the C library keeps it in a thread-local), so it
tags what this thread allocates: torch allocations made from this Python
thread, through libsymmem as the global allocator or a ``MemPool``, included.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Iterator, Optional

from . import _lib
from ._lib import check
from .errors import C_PTR, C_SIZE, Result, brief, int_arg

__all__ = [
    "REGION_BACKUP",
    "REGION_BACKUP_PAGEABLE",
    "region",
    "untagged",
    "set_default_tag",
    "set_backup_dir",
    "pause",
    "resume",
    "backup_pointer",
    "backup_state",
    "tag_bytes",
]

REGION_BACKUP = 1  # SYMMEM_REGION_BACKUP
REGION_BACKUP_PAGEABLE = 2  # SYMMEM_REGION_BACKUP_PAGEABLE
REGION_UNTAGGED = 4  # SYMMEM_REGION_UNTAGGED
REGION_BACKUP_DISK = 8  # SYMMEM_REGION_BACKUP_DISK
REGION_OWN_DEVICE = 16  # SYMMEM_REGION_OWN_DEVICE
PAUSE_DISCARD = 1  # SYMMEM_PAUSE_DISCARD
PAUSE_KEEP = 2  # SYMMEM_PAUSE_KEEP
RESUME_NO_FILL = 1  # SYMMEM_RESUME_NO_FILL
RESUME_RELEASE_BACKUP = 2  # SYMMEM_RESUME_RELEASE_BACKUP
RESUME_RETAIN_BACKUP = 4  # SYMMEM_RESUME_RETAIN_BACKUP
_RESUME_BACKUP = {"keep": 0, "release": RESUME_RELEASE_BACKUP, "retain": RESUME_RETAIN_BACKUP}


def _region_flags(backup, own_device=False) -> int:
    if not isinstance(own_device, bool):
        raise TypeError(f"own_device must be a bool, not {type(own_device).__name__}")
    own = REGION_OWN_DEVICE if own_device else 0
    if backup is False or backup is None:
        return own
    if backup is True or backup == "pinned":
        return REGION_BACKUP | own
    if backup == "pageable":
        return REGION_BACKUP | REGION_BACKUP_PAGEABLE | own
    if backup == "disk":
        return REGION_BACKUP | REGION_BACKUP_DISK | own
    raise ValueError(f"backup must be False, True, 'pinned', 'pageable' or 'disk', not {brief(backup)}")


def _tag_arg(tag: Optional[str]) -> Optional[bytes]:
    if tag is None:
        return None
    if not isinstance(tag, str):
        raise TypeError(f"tag must be a str or None, not {type(tag).__name__}")
    return tag.encode()


@contextlib.contextmanager
def region(tag: str, backup: bool = False, *, own_device: bool = False) -> Iterator[None]:
    """Tag this thread's allocations with ``tag`` inside the ``with`` block.

    ``backup`` keeps a host copy of the tag's memory across a pause (True or
    "pinned": pinned memory; "pageable": reclaimable anonymous memory;
    "disk": a file of :func:`set_backup_dir`'s directory). ``own_device``
    maps the tag's memory for its own GPU alone (SYMMEM_REGION_OWN_DEVICE):
    other GPUs of this process cannot read it directly, and mapping and
    resuming skip their page tables (about 20 ms per 4 GiB and peer GPU on
    an H200). Every region of a tag must ask for the same. Regions nest (the
    innermost wins).
    """
    lib = _lib.lib()
    if not isinstance(tag, str):
        raise TypeError(f"tag must be a str, not {type(tag).__name__}")
    check(lib.symmem_region_begin(tag.encode(), _region_flags(backup, own_device)), "symmem_region_begin")
    try:
        yield
    finally:
        check(lib.symmem_region_end(), "symmem_region_end")


@contextlib.contextmanager
def untagged() -> Iterator[None]:
    """Inside the ``with`` block this thread's allocations carry no tag,
    whatever the outer regions and the default tag say."""
    lib = _lib.lib()
    check(lib.symmem_region_begin(None, REGION_UNTAGGED), "symmem_region_begin")
    try:
        yield
    finally:
        check(lib.symmem_region_end(), "symmem_region_end")


def set_backup_dir(path: Optional[str]) -> None:
    """The directory of ``backup="disk"`` copies (made if missing); None goes
    back to $SYMMEM_BACKUP_DIR, else the temporary directory."""
    lib = _lib.lib()
    check(lib.symmem_set_backup_dir(None if path is None else os.fsencode(path)), "symmem_set_backup_dir")


def set_default_tag(tag: Optional[str], backup=False, *, own_device: bool = False) -> None:
    """Tag every allocation made outside a region, on every thread, with
    ``tag`` (``backup`` and ``own_device`` as for :func:`region`); None
    clears it."""
    lib = _lib.lib()
    if tag is None:
        check(lib.symmem_set_default_tag(None, 0), "symmem_set_default_tag")
        return
    if not isinstance(tag, str):
        raise TypeError(f"tag must be a str or None, not {type(tag).__name__}")
    check(lib.symmem_set_default_tag(tag.encode(), _region_flags(backup, own_device)), "symmem_set_default_tag")


def _group_ptr(group) -> int:
    ptr = getattr(group, "ptr", None)
    if ptr is None:
        raise TypeError(f"group must be a symmem.Group, not {type(group).__name__}")
    return ptr


def pause(tag: Optional[str] = None, group=None, backup: Optional[bool] = None) -> None:
    """Release the physical memory of ``tag`` (None: every tag; "" is an
    error, not every tag).

    Waits for the device's work, copies the contents to the host if the tag
    asked for backup, unmaps and releases; addresses stay reserved.
    ``backup`` overrides the tag for this pause: False discards the contents
    (zero after the resume), True keeps a host copy of a tag without backup.
    With ``group`` (a :class:`symmem.Group`), collective: every rank calls
    it, and the peers' mappings of the tag's rendezvoused buffers go too
    (``backup`` is not available there).
    """
    lib = _lib.lib()
    if group is None:
        if backup is None:
            check(lib.symmem_pause(_tag_arg(tag)), "symmem_pause")
        else:
            flags = PAUSE_KEEP if backup else PAUSE_DISCARD
            check(lib.symmem_pause_with(_tag_arg(tag), flags), "symmem_pause_with")
    else:
        if backup is not None:
            raise ValueError("symmem.pause: backup= is not available with group= (symmem_pause_group follows the tag)")
        check(lib.symmem_pause_group(_group_ptr(group), _tag_arg(tag)), "symmem_pause_group")


def resume(tag: Optional[str] = None, group=None, zero: bool = True, backup: str = "keep") -> None:
    """Take back the memory of ``tag`` (None: every paused tag) at the same
    addresses and restore its backup (zero without one; with ``zero=False``
    memory without a host copy is left undefined, which saves a pass over
    it at device bandwidth).

    ``backup`` says what becomes of the host copies once restored: "keep"
    (kept for the next cycle, so that the next pause allocates nothing),
    "release" (given back: :func:`backup_pointer` finds none; a pinned copy
    stays pinned ahead of the next pause within SYMMEM_BACKUP_PIN_AHEAD,
    others are freed) or "retain" (kept at the same host address through
    the next pause).

    Raises :class:`symmem.OutOfMemoryError` naming the tag and the bytes when
    memory runs out; nothing stays half-mapped and the call can be retried.
    With ``group``, collective, like :func:`pause` (always zero-filled).
    """
    lib = _lib.lib()
    if backup not in _RESUME_BACKUP:
        raise ValueError(f"symmem.resume: backup must be 'keep', 'release' or 'retain', not {brief(backup)}")
    if group is None:
        flags = (0 if zero else RESUME_NO_FILL) | _RESUME_BACKUP[backup]
        if flags == 0:
            check(lib.symmem_resume(_tag_arg(tag)), "symmem_resume")
        else:
            check(lib.symmem_resume_with(_tag_arg(tag), flags), "symmem_resume_with")
    else:
        if backup != "keep":
            raise ValueError("symmem.resume: backup= is not available with group= (symmem_resume_group keeps the copies)")
        if not zero:
            raise ValueError("symmem.resume: zero=False is not available with group= (symmem_resume_group zero-fills)")
        check(lib.symmem_resume_group(_group_ptr(group), _tag_arg(tag)), "symmem_resume_group")


def _backup_pointer(ptr: int, size: int, what: str):
    """One symmem_backup_pointer call: (result code, host address, paused now)."""
    ptr, size = int_arg(ptr, "ptr", what, C_PTR), int_arg(size, "size", what, C_SIZE)
    lib = _lib.lib()
    host = ctypes.c_void_p()
    paused = ctypes.c_int()
    rc = lib.symmem_backup_pointer(ptr, size, ctypes.byref(host), ctypes.byref(paused))
    return rc, int(host.value or 0), bool(paused.value)


def backup_pointer(ptr: int, size: int):
    """The host copy of ``size`` bytes at ``ptr`` (within one segment): a
    pair (host address, paused now). The copy is what the last pause of the
    tag saved; :class:`symmem.InvalidStateError` when there is none (no
    backup, discarded, never paused)."""
    rc, host, paused = _backup_pointer(ptr, size, "symmem.backup_pointer")
    check(rc, "symmem_backup_pointer")
    return host, paused


def backup_state(ptr: int, size: int):
    """As :func:`backup_pointer`, but a missing copy is (None, paused now)
    instead of an error; other errors (memory libsymmem did not allocate,
    a range past its segment) raise."""
    rc, host, paused = _backup_pointer(ptr, size, "symmem.backup_state")
    if rc == Result.INVALID_STATE:
        return None, paused
    check(rc, "symmem_backup_pointer")
    return host, paused


def tag_bytes(tag: str):
    """(live, paused): the bytes of ``tag``'s segments on every device,
    mapped now and released by a pause."""
    if not isinstance(tag, str):
        raise TypeError(f"tag must be a str, not {type(tag).__name__}")
    lib = _lib.lib()
    live = ctypes.c_size_t()
    paused = ctypes.c_size_t()
    check(lib.symmem_tag_bytes(tag.encode(), ctypes.byref(live), ctypes.byref(paused)), "symmem_tag_bytes")
    return int(live.value), int(paused.value)
