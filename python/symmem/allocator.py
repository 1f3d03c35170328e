"""The caching allocator: alloc/free, caches, limits, statistics.

Pointers are plain ints (0 is NULL); streams are ints holding a CUstream /
cudaStream_t (0 is the legacy default stream; the host backend only numbers
streams).
"""

from __future__ import annotations

import ctypes
from typing import Dict, NamedTuple, Optional

from . import _lib
from ._lib import check, check_last_error, check_pointer
from .errors import C_INT, C_PTR, C_SIZE, Result, int_arg

__all__ = [
    "version",
    "version_tuple",
    "backend_name",
    "backend_notes",
    "device_count",
    "alloc",
    "free",
    "record_stream",
    "empty_cache",
    "set_memory_limit",
    "get_memory_limit",
    "set_memory_fraction",
    "memory_stats",
    "reset_peak_memory_stats",
    "PointerInfo",
    "pointer_info",
    "validate",
    "copy",
    "memset",
]


def _s(b: Optional[bytes]) -> str:
    return b.decode("utf-8", "replace") if b else ""


def _stream(stream, what: str = "symmem") -> Optional[int]:
    """A stream argument as the c_void_p value ctypes expects: None, an int
    holding a CUstream, or an object with .cuda_stream (torch.cuda.Stream
    and friends expose the raw handle so)."""
    if stream is None:
        return None
    raw = getattr(stream, "cuda_stream", stream)
    return int_arg(raw, "stream", what, C_PTR) or None


def version() -> int:
    """The library's version: MAJOR*10000 + MINOR*100 + PATCH."""
    return int(_lib.lib().symmem_version())


def version_tuple() -> tuple:
    """The library's version as (major, minor, patch)."""
    v = version()
    return (v // 10000, v // 100 % 100, v % 100)


def backend_name() -> str:
    """"cuda", "host", or "none" when no backend could be opened."""
    return _s(_lib.lib().symmem_backend_name())


def backend_notes() -> str:
    """Why backends were skipped during selection, one per line ("" if none)."""
    return _s(_lib.lib().symmem_backend_notes())


def device_count() -> int:
    """Number of devices of the backend (the host backend has one)."""
    return int(_lib.lib().symmem_device_count())


def alloc(size: int, device: int = 0, stream=0) -> int:
    """Allocate size bytes on device for use on stream; returns the pointer.

    Raises OutOfMemoryError, InvalidDeviceError, UnavailableError, ...
    Size 0 returns a distinct pointer that must be freed like any other.
    """
    w = "symmem.alloc"
    # More than size_t can hold is more memory than there is: OUT_OF_MEMORY.
    size = int_arg(size, "size", w, C_SIZE)
    device = int_arg(device, "device", w, C_INT)
    lib = _lib.lib()
    return int(check_pointer(lib.symmem_alloc, size, device, _stream(stream, w), what="symmem_alloc"))


def free(ptr, size: Optional[int] = None, device: Optional[int] = None, stream=0) -> None:
    """Return ptr (an int, or an owning Buffer from :func:`symmem.empty`,
    which is freed as its own ``free()`` does) to the cache.

    size, device and stream are what the allocation was made with. When size
    or device is None it is looked up (symmem_pointer_get_info), so that a
    caller who does not know them never trips the library's checks: the
    pointer's device is known to the library. Raises
    InvalidPointerError for a pointer not allocated here, an interior pointer
    or a double free. ptr 0 is a no-op.
    """
    # A symmem.Buffer frees itself (buffer.py imports this module, so the
    # Buffer is recognised by the method it has, not by its class).
    free_buffer = getattr(type(ptr), "_free_through_symmem_free", None)
    if free_buffer is not None:
        free_buffer(ptr)
        return
    w = "symmem.free"
    ptr = int_arg(ptr, "ptr", w, C_PTR)
    size = None if size is None else int_arg(size, "size", w, C_SIZE)
    device = None if device is None else int_arg(device, "device", w, C_INT)
    raw_stream = _stream(stream, w)
    if not ptr:
        return
    lib = _lib.lib()
    if size is None or device is None:
        info = _lib.SymmemPointerInfo()
        if lib.symmem_pointer_get_info(ptr, ctypes.byref(info)) == Result.SUCCESS and info.block == ptr:
            size = int(info.requested_size) if size is None else size
            device = int(info.device) if device is None else device
        else:
            # the free below reports the bad pointer in its own words
            size = 0 if size is None else size
            device = 0 if device is None else device
    check_last_error(lib.symmem_free, ptr, size, device, raw_stream, what="symmem_free")


def record_stream(ptr: int, stream) -> None:
    """Mark that ptr is also used on stream (see symmem_record_stream)."""
    lib = _lib.lib()
    ptr = int_arg(ptr, "ptr", "symmem.record_stream", C_PTR)
    check_last_error(lib.symmem_record_stream, ptr, _stream(stream, "symmem.record_stream"), what="symmem_record_stream")


def empty_cache(device: int = -1) -> None:
    """Release idle cached segments of device (-1: every device)."""
    check(_lib.lib().symmem_empty_cache(int_arg(device, "device", "symmem.empty_cache", C_INT)), "symmem_empty_cache")


def thread_caches_drain(device: int = -1) -> None:
    """Give the blocks held in thread caches of device (-1: every device)
    back to the allocator (symmem_thread_caches_drain): the next allocation
    is placed as without the caches, the same on every rank even where one
    rank freed scratch memory the others did not. :func:`symmem.empty` and
    ``symmem.torch.empty`` do it before allocating."""
    device = int_arg(device, "device", "symmem.thread_caches_drain", C_INT)
    check(_lib.lib().symmem_thread_caches_drain(device), "symmem_thread_caches_drain")


def set_memory_limit(device: int, nbytes: int) -> None:
    """Cap device's reserved bytes at nbytes (0 removes the limit)."""
    w = "symmem.set_memory_limit"
    device, nbytes = int_arg(device, "device", w, C_INT), int_arg(nbytes, "nbytes", w, C_SIZE)
    check(_lib.lib().symmem_set_memory_limit(device, nbytes), "symmem_set_memory_limit")


def get_memory_limit(device: int = 0) -> int:
    """device's memory limit in bytes (0: none)."""
    out = ctypes.c_size_t(0)
    device = int_arg(device, "device", "symmem.get_memory_limit", C_INT)
    check(_lib.lib().symmem_get_memory_limit(device, ctypes.byref(out)), "symmem_get_memory_limit")
    return int(out.value)


def set_memory_fraction(fraction: float, device: int = 0) -> None:
    """Set device's limit to fraction (0 < fraction <= 1) of its memory."""
    device = int_arg(device, "device", "symmem.set_memory_fraction", C_INT)
    lib = _lib.lib()
    check_last_error(lib.symmem_memory_fraction, float(fraction), device, what="symmem_memory_fraction")


def memory_stats(device: int = 0) -> Dict[str, int]:
    """device's statistics, keyed like torch.cuda.memory_stats.

    For example "allocated_bytes.all.current", "reserved_bytes.all.peak",
    "num_device_alloc", "memory_limit". Keys come in the library's order.
    """
    lib = _lib.lib()
    device = int_arg(device, "device", "symmem.memory_stats", C_INT)
    lib.symmem_clear_last_error()
    n = int(lib.symmem_stats(device, None, 0))
    if n == 0:
        code = int(lib.symmem_last_error())
        if code != Result.SUCCESS:
            check(code, "symmem_stats")
        return {}
    # The count cannot change between calls (keys are fixed), but be safe.
    while True:
        arr = (_lib.SymmemStat * n)()
        m = int(lib.symmem_stats(device, arr, n))
        if m <= n:
            break
        n = m
    return {_s(arr[i].key): int(arr[i].value) for i in range(m)}


def reset_peak_memory_stats(device: int = 0) -> None:
    """Set every ``.peak`` statistic of device to its ``.current`` value."""
    device = int_arg(device, "device", "symmem.reset_peak_memory_stats", C_INT)
    check(_lib.lib().symmem_reset_peak_stats(device), "symmem_reset_peak_stats")


class PointerInfo(NamedTuple):
    """Where a pointer lives (``struct symmem_pointer_info``)."""

    block: int
    block_size: int
    requested_size: int
    offset: int
    heap_offset: int
    device: int


def pointer_info(ptr: int) -> PointerInfo:
    """Describe a pointer anywhere inside a live allocation.

    Raises InvalidPointerError if ptr is not inside one.
    """
    info = _lib.SymmemPointerInfo()
    ptr = int_arg(ptr, "ptr", "symmem.pointer_info", C_PTR)
    check(_lib.lib().symmem_pointer_get_info(ptr, ctypes.byref(info)), "symmem_pointer_get_info")
    return PointerInfo(
        block=int(info.block or 0),
        block_size=int(info.block_size),
        requested_size=int(info.requested_size),
        offset=int(info.offset),
        heap_offset=int(info.heap_offset),
        device=int(info.device),
    )


def copy(dst: int, src: int, nbytes: int, device: int = 0, stream=0) -> None:
    """Copy nbytes from address src to address dst with the backend.

    Either side may be memory of device (local, or a peer's mapped through a
    handle) or host memory; on cuda the copy is queued on stream and waited
    for. nbytes 0 is a no-op.
    """
    w = "symmem.copy"
    dst, src = int_arg(dst, "dst", w, C_PTR), int_arg(src, "src", w, C_PTR)
    nbytes, device = int_arg(nbytes, "nbytes", w, C_SIZE), int_arg(device, "device", w, C_INT)
    rc = _lib.lib().symmem_copy(dst or None, src or None, nbytes, device, _stream(stream, w))
    check(rc, "symmem_copy")


def memset(dst: int, value: int, nbytes: int, device: int = 0, stream=0) -> None:
    """Set nbytes at address dst to value (a byte) with the backend; waits."""
    w = "symmem.memset"
    dst, value = int_arg(dst, "dst", w, C_PTR), int_arg(value, "value", w, C_INT)
    nbytes, device = int_arg(nbytes, "nbytes", w, C_SIZE), int_arg(device, "device", w, C_INT)
    check(_lib.lib().symmem_memset(dst or None, value, nbytes, device, _stream(stream, w)), "symmem_memset")


def validate(device: int = 0) -> None:
    """Run the allocator's invariant checker; raises InternalError if broken."""
    check(_lib.lib().symmem_validate(int_arg(device, "device", "symmem.validate", C_INT)), "symmem_validate")
