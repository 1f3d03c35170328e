"""Tags, pause and resume (include/symmem.h, "Tags and pause").

Allocations made on a thread inside ``with region(tag)`` carry the tag; a
tag's memory can then be given back whole and taken again at the same
addresses::

    with symmem.region("weights", backup=True):
        w = symmem.alloc(1 << 30)
    symmem.pause("weights")      # physical memory released, w stays reserved
    symmem.resume("weights")     # same address, contents restored

Without ``backup=True`` the contents are ZERO after a resume. Memory that a
rendezvous shared with other processes is paused collectively:
``symmem.pause(tag, group=g)`` on every rank of ``g``.

A region is per thread (the C library keeps it in a thread-local), so it
tags what this thread allocates: torch allocations made from this Python
thread, through libsymmem as the global allocator or a ``MemPool``, included.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

from . import _lib
from ._lib import check

__all__ = ["REGION_BACKUP", "region", "pause", "resume"]

REGION_BACKUP = 1  # SYMMEM_REGION_BACKUP


def _tag_arg(tag: Optional[str]) -> Optional[bytes]:
    if tag is None:
        return None
    if not isinstance(tag, str):
        raise TypeError(f"tag must be a str or None, not {type(tag).__name__}")
    return tag.encode()


@contextlib.contextmanager
def region(tag: str, backup: bool = False) -> Iterator[None]:
    """Tag this thread's allocations with ``tag`` inside the ``with`` block.

    ``backup`` keeps a host copy of the tag's memory across a pause; every
    region of a tag must ask for the same. Regions nest (the innermost wins).
    """
    lib = _lib.lib()
    if not isinstance(tag, str):
        raise TypeError(f"tag must be a str, not {type(tag).__name__}")
    check(lib.symmem_region_begin(tag.encode(), REGION_BACKUP if backup else 0), "symmem_region_begin")
    try:
        yield
    finally:
        check(lib.symmem_region_end(), "symmem_region_end")


def _group_ptr(group) -> int:
    ptr = getattr(group, "ptr", None)
    if ptr is None:
        raise TypeError(f"group must be a symmem.Group, not {type(group).__name__}")
    return ptr


def pause(tag: Optional[str] = None, group=None) -> None:
    """Release the physical memory of ``tag`` (None: every tag).

    Waits for the device's work, copies the contents to the host if the tag
    asked for backup, unmaps and releases; addresses stay reserved. With
    ``group`` (a :class:`symmem.Group`), collective: every rank calls it, and
    the peers' mappings of the tag's rendezvoused buffers go too.
    """
    lib = _lib.lib()
    if group is None:
        check(lib.symmem_pause(_tag_arg(tag)), "symmem_pause")
    else:
        check(lib.symmem_pause_group(_group_ptr(group), _tag_arg(tag)), "symmem_pause_group")


def resume(tag: Optional[str] = None, group=None) -> None:
    """Take back the memory of ``tag`` (None: every paused tag) at the same
    addresses and restore its backup (zero without one).

    Raises :class:`symmem.OutOfMemoryError` naming the tag and the bytes when
    memory runs out; nothing stays half-mapped and the call can be retried.
    With ``group``, collective, like :func:`pause`.
    """
    lib = _lib.lib()
    if group is None:
        check(lib.symmem_resume(_tag_arg(tag)), "symmem_resume")
    else:
        check(lib.symmem_resume_group(_group_ptr(group), _tag_arg(tag)), "symmem_resume_group")
