"""Buffer: a block of libsymmem memory as a Python object.

A Buffer either owns its block (``symmem.empty``: freed by ``.free()``, by
the ``with`` block's end, or when the object is collected) or is a view that
owns nothing (a peer's memory from ``Handle.get_buffer``; the view keeps its
handle alive).

Access:
  * either backend: ``.read()``, ``.write(data)``, ``.fill(value)`` (through
    symmem_copy / symmem_memset: on cuda a copy on ``.stream``, waited for);
  * host backend: ``.memoryview()`` (writable, ``'B'`` format), the Python
    3.12 buffer protocol (``memoryview(buf)``, ``bytes(buf)``), and
    ``__array_interface__`` (numpy, if the caller has it);
  * cuda backend: ``__cuda_array_interface__`` (uint8, shape ``(nbytes,)``).
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any, List, Optional, Tuple

from . import _lib, allocator
from ._owned import Owned
from ._lib import check
from .errors import C_INT, C_PTR, C_SIZE, Result, SymmemError, int_arg, make_error

__all__ = ["Buffer", "empty"]


class Buffer:
    """nbytes of memory at ptr on device.

    Attributes:
        ptr: the address (int).
        nbytes: the usable size in bytes.
        device: the device index.
        kind: "host" or "cuda": how the memory may be touched from Python.
        owning: whether free() releases the memory.
        stream: the allocation stream (what free() passes back).
    """

    __slots__ = (
        "ptr", "nbytes", "device", "kind", "owning", "stream", "_keep", "_owned", "_views", "_gone", "__weakref__",
    )

    def __init__(
        self,
        ptr: int,
        nbytes: int,
        device: int = 0,
        kind: Optional[str] = None,
        *,
        owning: bool = False,
        stream: int = 0,
        keep: Any = None,
    ):
        w = "symmem.Buffer"
        self.ptr = int_arg(ptr, "ptr", w, C_PTR)
        self.nbytes = int_arg(nbytes, "nbytes", w, C_SIZE)
        self.device = int_arg(device, "device", w, C_INT)
        self.kind = kind or allocator.backend_name()
        self.owning = owning
        self.stream = int_arg(stream or 0, "stream", w, C_PTR)
        self._keep = keep  # e.g. the Handle a peer view comes from
        self._views: List[weakref.ref] = []
        # Why a view may no longer be touched (its handle was released), or
        # None while it may.
        self._gone: Optional[str] = None
        # The memory, when owning: free() or the collector frees it
        # (symmem._owned); requested size = nbytes, so symmem_free's size
        # check passes.
        self._owned = Owned(allocator.free, self.ptr, self.nbytes, self.device, self.stream) if owning else None

    # -- life ---------------------------------------------------------------

    @property
    def freed(self) -> bool:
        """Whether an owning buffer has been freed."""
        return self._owned is not None and not self._owned.alive

    def _free_through_symmem_free(self) -> None:
        """symmem.free(buffer): only the owner frees memory."""
        if not self.owning:
            raise make_error(Result.INVALID_ARGUMENT, "symmem.free: this Buffer is a view (of a peer's memory or of "
                             "memory it does not own): only the owner frees memory")
        self.free()

    def free(self) -> None:
        """Free the memory now (owning buffers; for views it only releases
        the memoryviews handed out).

        Memoryviews handed out by :meth:`memoryview` are released first, so
        that using one afterwards raises ValueError instead of touching
        freed memory. If one cannot be released because it is exported to
        another object (numpy's frombuffer, a torch tensor), nothing is freed
        and InvalidStateError is raised: drop that object and call again.
        """
        self._release_views("free")
        owed = self._owned.take() if self._owned is not None else None
        if owed is not None:
            allocator.free(*owed)

    def _release_views(self, what: str) -> None:
        """Release every memoryview handed out; raise InvalidStateError if
        one is exported to another object (the others stay released)."""
        live = [mv for mv in (ref() for ref in self._views) if mv is not None]
        for mv in live:
            try:
                mv.release()  # refused (BufferError) while exported
            except BufferError:
                raise make_error(
                    Result.INVALID_STATE,
                    f"symmem.Buffer.{what}: a memoryview of this buffer (0x{self.ptr:x}) is still exported to "
                    "another object (numpy, torch, ...); drop that object first",
                ) from None
            except ValueError:
                pass
        self._views.clear()

    def _invalidate(self, why: str) -> None:
        """Called by a Handle being released: release the memoryviews of this
        view and make every later access raise InvalidStateError."""
        self._release_views("release")
        self._gone = why

    def __enter__(self) -> "Buffer":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self.freed else ("released" if self._gone else ("owning" if self.owning else "view"))
        return f"<symmem.Buffer ptr=0x{self.ptr:x} nbytes={self.nbytes} device={self.device} {self.kind} {state}>"

    def __len__(self) -> int:
        return self.nbytes

    def _check_live(self) -> None:
        if self.freed:
            raise make_error(Result.INVALID_STATE, "symmem.Buffer: used after free()")
        if self._gone is not None:
            raise make_error(Result.INVALID_STATE, f"symmem.Buffer: {self._gone}")

    def _check_not_paused(self, what: str) -> None:
        """Raise InvalidStateError naming the tag when the buffer's memory is
        paused: handing out its address for the CPU to read would fault
        (the process dies of SIGSEGV) instead of saying why."""
        from . import tags  # tags imports nothing of this module

        rc, _, paused = tags._backup_pointer(self.ptr, 1, f"symmem.Buffer.{what}")
        if rc not in (Result.SUCCESS, Result.INVALID_STATE) or not paused:
            return  # not libsymmem's memory (a peer's), or live
        # The library's own check names the tag (symmem_copy refuses a
        # paused block before touching it).
        probe = ctypes.create_string_buffer(1)
        why = "it is in a paused tag: resume it first"
        try:
            allocator.copy(ctypes.addressof(probe), self.ptr, 1, self.device, self.stream)
        except SymmemError as e:
            why = e.message.split("src: ", 1)[-1]
        raise make_error(Result.INVALID_STATE, f"symmem.Buffer.{what}: {why}")

    # -- host access --------------------------------------------------------

    def memoryview(self) -> memoryview:
        """A writable byte memoryview of the memory (host backend only).

        The view keeps this Buffer alive; it is released by :meth:`free`
        (and, for a peer's memory from ``Handle.get_buffer``, by the
        handle's ``release()``), after which using it raises ValueError
        instead of touching memory that is gone. Objects that hold a buffer
        of it (numpy.frombuffer, PickleBuffer) make free/release refuse with
        InvalidStateError until they are dropped; objects that only copy its
        address (ctypes from_buffer, memoryview(mv)) cannot be seen and must
        not outlive the buffer or handle. While the buffer's tag is paused
        this raises InvalidStateError naming the tag; a memoryview taken
        before the pause must not be read until the resume (its memory is
        gone: the read would fault). Do not use it in a child forked
        from this process: the library's memory
        is not inherited (MADV_DONTFORK), a child that touches it faults.
        """
        self._check_live()
        if self.kind != "host":
            raise make_error(
                Result.UNAVAILABLE,
                f"symmem.Buffer.memoryview: {self.kind} memory is not addressable from the CPU "
                "(use __cuda_array_interface__)",
            )
        self._check_not_paused("memoryview")
        arr = (ctypes.c_char * self.nbytes).from_address(self.ptr)
        arr._symmem_owner = self  # the array (and so the view) keeps us alive
        mv = memoryview(arr).cast("B")
        self._views.append(weakref.ref(mv))
        return mv

    def __buffer__(self, flags: int) -> memoryview:  # Python >= 3.12
        return self.memoryview()

    def __release_buffer__(self, view: memoryview) -> None:  # Python >= 3.12
        pass

    # -- copies (either backend) ---------------------------------------------

    def _range(self, offset: int, nbytes: Optional[int], what: str) -> Tuple[int, int]:
        w = f"symmem.Buffer.{what}"
        offset = int_arg(offset, "offset", w, C_SIZE)
        nbytes = None if nbytes is None else int_arg(nbytes, "nbytes", w, C_SIZE)
        if nbytes is None:
            nbytes = self.nbytes - offset
        if offset + nbytes > self.nbytes:
            raise make_error(
                Result.INVALID_ARGUMENT,
                f"symmem.Buffer.{what}: [{offset}, {offset + nbytes}) is outside the buffer's {self.nbytes} bytes",
            )
        return offset, nbytes

    def read(self, offset: int = 0, nbytes: Optional[int] = None) -> bytes:
        """A copy of nbytes (default: to the end) from offset."""
        self._check_live()
        offset, nbytes = self._range(offset, nbytes, "read")
        out = ctypes.create_string_buffer(nbytes)
        if nbytes:
            allocator.copy(ctypes.addressof(out), self.ptr + offset, nbytes, self.device, self.stream)
        return out.raw

    def write(self, data, offset: int = 0) -> None:
        """Copy data (bytes-like) into the buffer at offset."""
        self._check_live()
        data = bytes(data)
        offset, _ = self._range(offset, len(data), "write")
        if data:
            src = ctypes.create_string_buffer(data, len(data))
            allocator.copy(self.ptr + offset, ctypes.addressof(src), len(data), self.device, self.stream)

    def fill(self, value: int, offset: int = 0, nbytes: Optional[int] = None) -> None:
        """Set nbytes (default: to the end) from offset to the byte value."""
        self._check_live()
        offset, nbytes = self._range(offset, nbytes, "fill")
        if nbytes:
            allocator.memset(self.ptr + offset, value, nbytes, self.device, self.stream)

    def tobytes(self) -> bytes:
        """A copy of the whole contents."""
        return self.read()

    @property
    def __array_interface__(self) -> dict:
        if self.kind != "host":
            raise AttributeError("__array_interface__ is only offered for host memory")
        self._check_live()
        self._check_not_paused("__array_interface__")
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 3}

    # -- cuda access --------------------------------------------------------

    @property
    def __cuda_array_interface__(self) -> dict:
        if self.kind != "cuda":
            # AttributeError, so that hasattr() says no on the host backend.
            raise AttributeError("__cuda_array_interface__ is only offered for cuda memory")
        self._check_live()
        return {
            "shape": (self.nbytes,),
            "typestr": "|u1",
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
            # No synchronisation: the producer (the caller) orders its work.
            "stream": None,
        }


def empty(nbytes: int, device: int = 0, stream=0) -> Buffer:
    """Allocate nbytes on device (uninitialised) and return an owning Buffer.

    Buffers from here are the ones rendezvous sees: the thread caches are
    drained first (:func:`symmem.thread_caches_drain`), so that the buffer's
    offset is the same on every rank that makes the same allocations, even
    where one rank freed scratch memory the others did not."""
    w = "symmem.empty"
    nbytes = int_arg(nbytes, "nbytes", w, C_SIZE)
    device = int_arg(device, "device", w, C_INT)
    raw_stream = allocator._stream(stream, w) or 0
    lib = _lib.lib()
    if lib.has("symmem_thread_caches_drain"):
        check(lib.symmem_thread_caches_drain(device), "symmem_thread_caches_drain")
    ptr = allocator.alloc(nbytes, device, raw_stream)
    try:
        return Buffer(ptr, nbytes, device, owning=True, stream=raw_stream)
    except BaseException:
        allocator.free(ptr, nbytes, device, raw_stream)
        raise
