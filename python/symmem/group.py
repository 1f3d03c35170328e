"""Symmetric memory: groups, rendezvous, handles and signals.

Mirrors ``torch.distributed._symmetric_memory``::

    with symmem.Group("job.tp", rank, world_size) as g:
        buf = symmem.empty(1 << 20)
        with symmem.rendezvous(buf, g) as h:
            peer = h.get_buffer((rank + 1) % world_size)
            ...
            h.barrier()

Timeouts are in seconds (float); None or 0 means the default (the group's
timeout; for a new group $SYMMEM_TIMEOUT_MS, else 300 s), as timeout_ms 0
does in C; a negative or NaN timeout raises InvalidArgumentError. Streams are
ints holding a CUstream (0: the legacy default stream), or objects with a
``.cuda_stream`` attribute (torch.cuda.Stream).
"""

from __future__ import annotations

import ctypes
import math
import re
import struct
import threading
import weakref
from typing import Callable, List, Optional, Sequence, Tuple, Union

from . import _coll, _lib
from ._owned import Owned
from .allocator import _stream, backend_name
from .buffer import Buffer
from ._lib import check, error_from_last
from .errors import C_INT, C_INT64, C_PTR, C_SIZE, Result, SymmemError, brief, int_arg, make_error, quote

__all__ = ["AllGather", "Group", "Handle", "nccl_version", "rendezvous"]

# A Python all-gather: takes this rank's record, returns every rank's record
# (world_size entries, in rank order, each as long as the one sent).
AllGather = Callable[[bytes], Sequence[bytes]]

# symmem.h's SYMMEM_NCCL_NO_WINDOWS.
NCCL_NO_WINDOWS = 1


def nccl_version() -> int:
    """The NCCL libsymmem loads (loading it): ncclGetVersion's code, 22809
    for 2.28.9. Raises UnavailableError saying what was found and needed."""
    lib = _lib.lib()
    v = int(lib.symmem_nccl_version())
    if v == 0:
        check(int(lib.symmem_last_error()), "symmem_nccl_version")
    return v


_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def _check_name(name, what: str) -> None:
    """A group's name: TypeError for anything but a str, InvalidArgumentError
    for a str the library would refuse (checked here first, so that the
    message is the call's)."""
    if not isinstance(name, str):
        raise TypeError(f"{what}: name must be a str, not {brief(name)}")
    if not _NAME_RE.match(name):
        raise make_error(
            Result.INVALID_ARGUMENT,
            f"{what}: bad name {quote(name)} (letters, digits, '.', '_', '-'; 1 to 64 characters)",
        )


_INT64_MAX = (1 << 63) - 1


def _timeout_ms(timeout: Optional[float], what: str = "symmem") -> int:
    """Seconds -> the library's milliseconds; None and 0 -> 0, the default
    (the group's timeout; for a new group $SYMMEM_TIMEOUT_MS, else 300 s),
    the one meaning include/symmem.h gives timeout_ms 0. Huge values (inf
    included) saturate at INT64_MAX ms, which the library saturates again,
    instead of wrapping; NaN and negative timeouts are refused (a negative
    wait has no meaning, and reading it as 300 s hid mistakes)."""
    if timeout is None:
        return 0
    timeout = float(timeout)
    if math.isnan(timeout) or timeout < 0:
        raise make_error(
            Result.INVALID_ARGUMENT,
            f"{what}: timeout {timeout} s: a timeout is a number of seconds >= 0 (None or 0: the group's timeout)",
        )
    if timeout == 0:
        return 0
    if timeout * 1000 >= _INT64_MAX:
        return _INT64_MAX
    return min(_INT64_MAX, max(1, int(round(timeout * 1000))))


# struct symmem_handle_desc read in one unpack: rank, world_size, then
# buffer_size, offset, signal_pad_size, then the four pointer arrays.
_DESC = struct.Struct("@2i3N4P")
assert _DESC.size == ctypes.sizeof(_lib.SymmemHandleDesc)


class _DescBuffer(threading.local):
    """Each thread's symmem_handle_desc for symmem_handle_describe, made
    once: the bytes that _DESC unpacks, and the pointer to pass."""

    def __init__(self) -> None:
        self.raw = bytearray(_DESC.size)
        self.ref = ctypes.byref(_lib.SymmemHandleDesc.from_buffer(self.raw))


_desc_buffer = _DescBuffer()


class Group:
    """This process's member of a named group of ranks.

    Creating it is collective: every rank of the group constructs a Group with
    the same name and world size, and the constructor returns once all have
    arrived (or raises TimeoutError naming the ranks that did not).

    Args:
        name: letters, digits, '.', '_', '-'; at most 64 characters.
        rank, world_size: this rank and the group's size.
        device: the device this rank's buffers live on.
        timeout: seconds that every wait of the group may take (None or 0:
            the library's default, $SYMMEM_TIMEOUT_MS or 300 s; negative:
            InvalidArgumentError).
        allgather: optional Python all-gather used for the group's small
            records instead of the built-in Unix-socket exchange (file
            descriptors still travel over the socket channel). It is called
            with this rank's bytes and must return world_size bytes objects in
            rank order, from the thread that made the collective call.
            Exceptions it raises fail the collective call and are chained to
            the SymmemError raised there.
    """

    def __init__(
        self,
        name: str,
        rank: int,
        world_size: int,
        device: int = 0,
        timeout: Optional[float] = None,
        allgather: Optional[AllGather] = None,
    ):
        w = "symmem.Group"
        _check_name(name, w)
        self.name = name
        rank, world_size = int_arg(rank, "rank", w, C_INT), int_arg(world_size, "world_size", w, C_INT)
        device = int_arg(device, "device", w, C_INT)
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
            raise TypeError(f"{w}: timeout must be a number of seconds or None, not {brief(timeout)}")
        # Known before the library confirms them, for the all-gather callback.
        self.rank, self.world_size, self.device = rank, world_size, device
        self._ptr: Optional[int] = None
        self._owned: Optional[Owned] = None
        self._mapped_peers: Optional[int] = None  # for Handle, asked with the first one
        self._allgather = allgather
        self._callback = None
        self._callback_error: Optional[BaseException] = None
        lib = _lib.lib()
        _lib.install_interrupts()
        out = ctypes.c_void_p()
        if allgather is None:
            rc = lib.symmem_group_create(name.encode(), rank, world_size, device, _timeout_ms(timeout, w), ctypes.byref(out))
        else:
            self._callback = _lib.ALLGATHER_FN(self._run_allgather)
            rc = lib.symmem_group_create_with_allgather(
                name.encode(), rank, world_size, device, _timeout_ms(timeout, w), self._callback, None, ctypes.byref(out)
            )
        self._raise_if(rc, "symmem_group_create")
        self._adopt(out)

    @classmethod
    def from_nccl(cls, comm: int, name: str, timeout: Optional[float] = None, windows: bool = True) -> "Group":
        """A group over an NCCL communicator the caller owns (an
        ``ncclComm_t`` as an int), as ``symmem_group_create_nccl``.

        Collective over the communicator. Rank, world size and device are the
        communicator's; the group's records are all-gathered through NCCL.
        With windows (the default) every rendezvous registers the buffer's
        segment as an NCCL symmetric window, once per segment; windows=False
        registers none. Destroy the group before the communicator. NCCL is
        loaded at run time (the copy already in the process, else
        $SYMMEM_LIBNCCL, else libnccl.so.2); without a usable NCCL (2.28 or
        newer) this raises UnavailableError saying what was found.
        """
        _check_name(name, "symmem.Group.from_nccl")
        comm = int_arg(comm, "comm", "symmem.Group.from_nccl", C_PTR)
        self = cls.__new__(cls)
        self.name = name
        self._ptr = None
        self._owned = None
        self._mapped_peers = None
        self._allgather = None
        self._callback = None
        self._callback_error = None
        self.nccl_comm = int(comm)
        lib = _lib.lib()
        _lib.install_interrupts()
        out = ctypes.c_void_p()
        flags = 0 if windows else NCCL_NO_WINDOWS
        rc = lib.symmem_group_create_nccl(ctypes.c_void_p(int(comm)), name.encode(), _timeout_ms(timeout, "symmem.Group.from_nccl"), flags, ctypes.byref(out))
        check(rc, "symmem_group_create_nccl")
        self._adopt(out)
        return self

    def _adopt(self, out: ctypes.c_void_p) -> None:
        """Own the ``symmem_group*`` a creation made (symmem._owned: destroy(),
        or the collector, destroys it) and read rank, world size and device
        from it."""
        lib = _lib.lib()
        self._ptr = int(out.value)
        self._owned = Owned(lib.symmem_group_destroy, self._ptr)
        self.rank = int(lib.symmem_group_rank(self._ptr))
        self.world_size = int(lib.symmem_group_world_size(self._ptr))
        self.device = int(lib.symmem_group_device(self._ptr))

    # -- local teams (docs/machines.md) -------------------------------------

    @property
    def local_rank(self) -> int:
        """This rank's index among the group's ranks on its machine."""
        return self._int("symmem_group_local_rank")

    @property
    def local_size(self) -> int:
        """How many of the group's ranks share this process's machine."""
        return self._int("symmem_group_local_size")

    def is_local(self, rank: int) -> bool:
        """Whether rank is on this process's machine (its buffers are mapped here)."""
        rank = int_arg(rank, "rank", "symmem.Group.is_local", C_INT)
        v = int(_lib.lib().symmem_group_is_local(self.ptr, rank))
        if v < 0:
            raise error_from_last(what="symmem_group_is_local")
        return v == 1

    def machine(self, rank: int) -> str:
        """Names rank's machine, as the library's messages do."""
        rank = int_arg(rank, "rank", "symmem.Group.machine", C_INT)
        lib = _lib.lib()
        n = int(lib.symmem_group_machine(self.ptr, rank, None, 0))
        if n == 0:
            raise error_from_last(what="symmem_group_machine")
        buf = ctypes.create_string_buffer(n + 1)
        lib.symmem_group_machine(self.ptr, rank, buf, n + 1)
        return buf.value.decode(errors="replace")

    def _int(self, fn: str) -> int:
        v = int(getattr(_lib.lib(), fn)(self.ptr))
        if v < 0:
            raise error_from_last(what=fn)
        return v

    def nccl_window_counts(self) -> Tuple[int, int, int]:
        """(registered, deregistered, live) NCCL windows of this group."""
        r, d, l = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
        check(
            _lib.lib().symmem_group_nccl_window_counts(self.ptr, ctypes.byref(r), ctypes.byref(d), ctypes.byref(l)),
            "symmem_group_nccl_window_counts",
        )
        return int(r.value), int(d.value), int(l.value)

    # -- the Python all-gather ---------------------------------------------

    def _run_allgather(self, send: int, recv: int, nbytes: int, user: int) -> int:
        """The ctypes callback: never lets an exception escape into C."""
        try:
            data = ctypes.string_at(send, nbytes) if nbytes else b""
            parts = list(self._allgather(data))
            if len(parts) != self.world_size:
                raise ValueError(f"allgather returned {len(parts)} records for a world of {self.world_size}")
            for r, part in enumerate(parts):
                part = bytes(part)
                if len(part) != nbytes:
                    raise ValueError(f"allgather: rank {r}'s record has {len(part)} bytes, expected {nbytes}")
                if nbytes:
                    ctypes.memmove(recv + r * nbytes, part, nbytes)
            return 0
        except BaseException as exc:  # noqa: BLE001 - reported through _raise_if
            self._callback_error = exc
            return 1

    def _raise_if(self, rc: int, what: str) -> None:
        """check(rc), chaining any exception the Python all-gather raised."""
        cb_error, self._callback_error = self._callback_error, None
        if rc == Result.SUCCESS:
            return
        if isinstance(cb_error, KeyboardInterrupt):
            raise cb_error  # Ctrl-C inside the Python all-gather: the creation failed and undid itself
        try:
            check(rc, what)
        except SymmemError as err:
            if cb_error is not None:
                raise err from cb_error
            raise

    # -- use ------------------------------------------------------------------

    @property
    def ptr(self) -> int:
        """The C ``symmem_group*`` (raises InvalidStateError once destroyed)."""
        if self._ptr is None:
            raise make_error(Result.INVALID_STATE, f"symmem.Group {self.name!r}: destroyed")
        return self._ptr

    def set_signal_pad_size(self, nbytes: int) -> None:
        """Size of each rank's signal pad; only before the first rendezvous."""
        nbytes = int_arg(nbytes, "nbytes", "symmem.Group.set_signal_pad_size", C_SIZE)
        check(_lib.lib().symmem_group_set_signal_pad_size(self.ptr, nbytes), "symmem_group_set_signal_pad_size")

    def rendezvous(self, buf_or_ptr: Union[Buffer, int]) -> "Handle":
        """Same as ``symmem.rendezvous(buf_or_ptr, self)``."""
        return rendezvous(buf_or_ptr, self)

    def abort(self) -> None:
        """Abort this rank's member of the group (``symmem_group_abort``): from
        any thread, every wait of this rank on the group returns (host waits
        raise AbortedError; on cuda the stream waits of barriers and signals
        are released and waiting kernels give up), and every later call on
        the group and its handles raises AbortedError. Then destroy it.
        Idempotent; a no-op on a destroyed group."""
        ptr = self._ptr
        if ptr is None:
            return
        check(_lib.lib().symmem_group_abort(ptr), "symmem_group_abort")

    def destroy(self) -> None:
        """Leave the group. Handles made from it stay valid until released."""
        owed = self._owned.take() if self._owned is not None else None
        self._ptr = None
        if owed is not None:
            check(_lib.lib().symmem_group_destroy(*owed), "symmem_group_destroy")

    def __enter__(self) -> "Group":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def __repr__(self) -> str:
        state = "" if self._ptr is not None else " destroyed"
        return f"<symmem.Group {self.name!r} rank={getattr(self, 'rank', '?')}/{getattr(self, 'world_size', '?')}{state}>"


_backend_of_handles: Optional[str] = None


def _remember_backend() -> str:
    """The backend's name, asked once: a handle exists, so the backend is
    open, and it is the process's until the process ends."""
    global _backend_of_handles
    _backend_of_handles = backend_name()
    return _backend_of_handles


class Handle:
    """The result of a rendezvous: every rank's buffer and signal pad.

    Attributes (fixed for the handle's life):
        rank, world_size
        buffer_size: the size of the block rendezvoused on (same on all ranks)
        offset: the offset of the rendezvous pointer in its block
        signal_pad_size: each rank's signal pad in bytes
        buffer_ptrs, signal_pad_ptrs: lists of world_size ints, the start of
            each rank's block / signal pad mapped in this process
        buffer_ptrs_dev, signal_pad_ptrs_dev: addresses of the same arrays
            for kernels (device memory on cuda, the host array on host)
    """

    # A rendezvous again makes a Handle and releases it in a loop of its
    # caller, so construction costs one C call (symmem_handle_describe into a
    # buffer each thread keeps), one read of the pointer arrays, and what the
    # group already knows; a handle never released is released when it is
    # collected (symmem._owned).

    def __init__(self, ptr: int, group: Optional[Group] = None):
        lib = _lib.lib()
        self._ptr: Optional[int] = int(ptr)
        self._owned = Owned(lib.symmem_handle_release, self._ptr)  # first: released should __init__ fail
        self._group = group  # keeps a Python all-gather callback alive
        # Every property in one call (a library without it raises
        # UnavailableError naming itself as older than this package).
        desc = _desc_buffer
        rc = lib.symmem_handle_describe(ptr, desc.ref)
        if rc:
            check(rc, "symmem_handle_describe")
        (self.rank, self.world_size, self.buffer_size, self.offset, self.signal_pad_size,
         bufs, pads, bufs_dev, pads_dev) = _DESC.unpack_from(desc.raw)
        self.buffer_ptrs, self.signal_pad_ptrs = _ptr_lists(bufs, pads, self.world_size)
        self.buffer_ptrs_dev = bufs_dev or 0
        self.signal_pad_ptrs_dev = pads_dev or 0
        self.device = group.device if group is not None else 0
        # Peers mapped here: the other ranks of this machine (docs/machines.md),
        # the same for every handle of a group, so asked once per group.
        mapped = group._mapped_peers if group is not None else None
        if mapped is None:
            mapped = int(lib.symmem_handle_mapped_peers(ptr))
            if group is not None and mapped >= 0:
                group._mapped_peers = mapped
        self.mapped_peers = mapped
        self.kind = _backend_of_handles or _remember_backend()
        # The views handed out (get_buffer, get_signal_pad): release()
        # invalidates them and their memoryviews first.
        self._views: List[weakref.ref] = []
        calls = _lib.calls()  # Note [The call module]
        self._put_signal = calls.put_signal
        self._wait_signal = calls.wait_signal
        self._barrier = calls.barrier
        self._collective_fn = calls.collective

    @property
    def ptr(self) -> int:
        """The C ``symmem_handle*`` (raises InvalidStateError once released)."""
        if self._ptr is None:
            raise make_error(Result.INVALID_STATE, "symmem.Handle: released")
        return self._ptr

    def _check_rank(self, rank: int, what: str) -> None:
        if not 0 <= rank < self.world_size:
            raise make_error(
                Result.INVALID_ARGUMENT, f"symmem.Handle.{what}: rank {rank} out of range [0, {self.world_size})"
            )

    def get_buffer(self, rank: int, nbytes: Optional[int] = None, offset: int = 0) -> Buffer:
        """A view (not owning) of rank's memory, mapped in this process.

        The view starts at the peer's equivalent of the rendezvous pointer
        (the rank's block + :attr:`offset`) plus ``offset`` bytes, and spans
        ``nbytes`` bytes (default: to the end of the block). It keeps this
        handle alive; it must not be used after :meth:`release`.
        """
        self.ptr  # raises once released
        w = "symmem.Handle.get_buffer"
        rank = int_arg(rank, "rank", w, C_INT)
        offset = int_arg(offset, "offset", w, C_SIZE)
        nbytes = None if nbytes is None else int_arg(nbytes, "nbytes", w, C_SIZE)
        self._check_rank(rank, "get_buffer")
        self._check_mapped(rank, "get_buffer")
        avail = self.buffer_size - self.offset
        if nbytes is None:
            nbytes = avail - offset
        if nbytes < 0 or offset + nbytes > avail:
            raise make_error(
                Result.INVALID_ARGUMENT,
                f"symmem.Handle.get_buffer: [{offset}, {offset + nbytes}) is outside the {avail} bytes "
                f"from the rendezvous pointer to the end of the block",
            )
        return self._view(self.buffer_ptrs[rank] + self.offset + offset, nbytes)

    def _check_mapped(self, rank: int, what: str) -> None:
        """Raises for a rank on another machine: its memory is not mapped here."""
        if self.buffer_ptrs[rank]:
            return
        where = ""
        if self._group is not None and self._group._ptr is not None:
            where = f" ({self._group.machine(rank)}; this process is on {self._group.machine(self.rank)})"
        raise make_error(
            Result.INVALID_ARGUMENT,
            f"symmem.Handle.{what}: rank {rank} is on another machine{where}: its memory is not mapped "
            f"in this process; reach it through the group's collectives or signals (NCCL)",
        )

    def _view(self, ptr: int, nbytes: int) -> Buffer:
        view = Buffer(ptr, nbytes, self.device, self.kind, keep=self)
        self._views = [r for r in self._views if r() is not None]
        self._views.append(weakref.ref(view))
        return view

    def get_signal_pad(self, rank: int) -> Buffer:
        """A view (not owning) of rank's signal pad."""
        self.ptr
        rank = int_arg(rank, "rank", "symmem.Handle.get_signal_pad", C_INT)
        self._check_rank(rank, "get_signal_pad")
        self._check_mapped(rank, "get_signal_pad")
        return self._view(self.signal_pad_ptrs[rank], self.signal_pad_size)

    # put_signal, wait_signal and barrier sit in loops of their callers:
    # they call the C functions bound at creation and format no message
    # unless the call fails (the fork guard stays: a forked child must not
    # enter the library).

    def put_signal(self, dst_rank: int, channel: int = 0, stream=0) -> None:
        """Add one to our signal count in dst_rank's pad on channel.

        Never waits for dst_rank: signals are counted, and each
        :meth:`wait_signal` of the receiver consumes one. On cuda it is
        enqueued on stream, after the work queued there before it.
        """
        if (type(dst_rank) is int and type(channel) is int and type(stream) is int and 0 <= dst_rank <= C_INT.hi
                and 0 <= channel <= C_INT.hi and 0 <= stream <= C_PTR.hi and not _lib._forked_child):
            rc = self._put_signal(self._ptr or self.ptr, dst_rank, channel, stream)  # as barrier's loop call
            if rc:
                check(rc, "symmem_put_signal")
            return
        if _lib._forked_child:
            _lib._refuse_forked_child()
        w = "symmem.Handle.put_signal"
        dst_rank, channel = int_arg(dst_rank, "dst_rank", w, C_INT), int_arg(channel, "channel", w, C_INT)
        rc = self._put_signal(self._ptr or self.ptr, dst_rank, channel, _stream(stream, w))
        if rc:
            check(rc, "symmem_put_signal")

    def wait_signal(self, src_rank: int, channel: int = 0, timeout: Optional[float] = None, stream=0) -> None:
        """Consume one signal from src_rank on channel, waiting for it.

        On the host backend it raises TimeoutError after timeout seconds
        (None: the group's timeout); on cuda it is enqueued on stream and
        later work on stream waits for it.
        """
        if (timeout is None and type(src_rank) is int and type(channel) is int and type(stream) is int
                and 0 <= src_rank <= C_INT.hi and 0 <= channel <= C_INT.hi and 0 <= stream <= C_PTR.hi
                and not _lib._forked_child):
            rc = self._wait_signal(self._ptr or self.ptr, src_rank, channel, 0, stream)  # as barrier's loop call
            if rc:
                check(rc, "symmem_wait_signal")
            return
        if _lib._forked_child:
            _lib._refuse_forked_child()
        w = "symmem.Handle.wait_signal"
        src_rank, channel = int_arg(src_rank, "src_rank", w, C_INT), int_arg(channel, "channel", w, C_INT)
        rc = self._wait_signal(self._ptr or self.ptr, src_rank, channel, _timeout_ms(timeout, w), _stream(stream, w))
        if rc:
            check(rc, "symmem_wait_signal")

    def barrier(self, channel: int = 0, timeout: Optional[float] = None, stream=0) -> None:
        """put_signal to every peer, then wait_signal from every peer."""
        if (timeout is None and type(channel) is int and type(stream) is int and 0 <= channel <= C_INT.hi
                and 0 <= stream <= C_PTR.hi and not _lib._forked_child):
            # The loop's call (a channel, the group's timeout, a raw stream):
            # the checks below in three comparisons; 0 is NULL to the C side.
            rc = self._barrier(self._ptr or self.ptr, channel, 0, stream)
            if rc:
                check(rc, "symmem_barrier")
            return
        if _lib._forked_child:
            _lib._refuse_forked_child()
        channel = int_arg(channel, "channel", "symmem.Handle.barrier", C_INT)
        rc = self._barrier(self._ptr or self.ptr, channel, _timeout_ms(timeout, "symmem.Handle.barrier"), _stream(stream, "symmem.Handle.barrier"))
        if rc:
            check(rc, "symmem_barrier")

    # Collectives (include/symmem.h, "Collectives on symmetric memory").
    # count is in elements of each rank's input (default: from the
    # rendezvous pointer to the end of the block); out an int address or a
    # Buffer. Every rank calls with the same dtype, op, count, algo, channel.

    def _collective(self, what: str, coll: int, dtype, op, count, out, algo, channel, stream) -> None:
        if _lib._forked_child:
            _lib._refuse_forked_child()
        w = f"symmem.Handle.{what}"
        count = None if count is None else int_arg(count, "count", w, C_SIZE)
        channel = int_arg(channel, "channel", w, C_INT)
        code = _coll.dtype_code(dtype, what)
        opc = _coll.op_code(op, what) if coll != _coll.ALL_GATHER else 0
        if count is None:
            count = (self.buffer_size - self.offset) // _coll.DTYPE_SIZES[code]
            if coll == _coll.REDUCE_SCATTER:
                count -= count % self.world_size
        if count < 0:
            raise make_error(Result.INVALID_ARGUMENT, f"{what}: count {count} is negative")
        rc = self._collective_fn(
            self.ptr, coll, code, opc, int(count), _coll.address(out, what), _coll.algo_code(algo, what),
            int(channel), _stream(stream),
        )
        if rc:
            check(rc, f"symmem_{what}")

    def all_reduce(self, dtype, op: str = "sum", count: Optional[int] = None, out=None, stream=0,
                   *, algo: Optional[str] = None, channel: int = 0, sm_free: bool = False) -> None:
        """Reduce every rank's input (count elements at the rendezvous
        pointer) into out (None: in place), in rank order, in fp32 for
        bfloat16/float16. algo: "auto" (default), "one_shot", "two_shot"
        (two-shot needs out inside the rendezvoused block), "low_latency"
        (one crossing of NVLink, no barrier: small calls, channel 0; auto
        takes it where it fits, docs/speed.md); on a group that
        spans machines "hierarchical" (reduce-scatter in each machine, NCCL
        across machines, all-gather in each machine; out inside the block)
        or "nccl" (the whole call on NCCL), auto choosing by size and
        topology (docs/machines.md); "copy_engine" (or sm_free=True): the
        peers' inputs pulled by the copy engines into a scratch and reduced
        there by a small kernel, leaving the SMs to the model (docs/speed.md,
        "Collectives on the copy engines")."""
        algo = _coll.sm_free_algo(algo, sm_free, "all_reduce")
        self._collective("all_reduce", _coll.ALL_REDUCE, dtype, op, count, out, algo, channel, stream)

    def all_gather(self, dtype, count: Optional[int] = None, out=None, stream=0, *, algo: Optional[str] = None,
                   channel: int = 0, sm_free: bool = False) -> None:
        """Write world_size * count elements to out: rank p's input at
        p * count. algo: "auto" (default: "low_latency" where it fits,
        else "one_shot"), "one_shot", "low_latency" or "copy_engine" (or
        sm_free=True: one copy per peer on the copy engines, no kernel)."""
        algo = _coll.sm_free_algo(algo, sm_free, "all_gather")
        self._collective("all_gather", _coll.ALL_GATHER, dtype, "sum", count, out, algo, channel, stream)

    def reduce_scatter(self, dtype, op: str = "sum", count: Optional[int] = None, out=None, stream=0,
                       *, algo: Optional[str] = None, channel: int = 0, sm_free: bool = False) -> None:
        """Write count // world_size elements to out: the reduction of this
        rank's slice (count a multiple of world_size; default: the whole
        buffer rounded down to one). algo and sm_free as all_gather's
        ("copy_engine": the peers' slices pulled by the copy engines, then
        a small reduction kernel)."""
        algo = _coll.sm_free_algo(algo, sm_free, "reduce_scatter")
        self._collective("reduce_scatter", _coll.REDUCE_SCATTER, dtype, op, count, out, algo, channel, stream)

    # All-to-all (include/symmem.h, "All-to-all (expert parallelism)"): the
    # input is at the rendezvous pointer of every rank; out, the splits and
    # out_splits_offsets are this rank's own memory (int addresses, Buffers
    # or tensors; host memory on the host backend, device memory on cuda,
    # where the kernel reads and writes them when it runs). Every rank calls
    # with the same form, row_bytes, experts, out_rows and major_align.

    def all_to_all(self, dtype, count: Optional[int] = None, out=None, stream=0, *, sm_free: bool = False) -> None:
        """Equal splits: chunk p of this rank's input (elements [p * count,
        (p + 1) * count)) goes to rank p, and out receives world_size *
        count elements, rank p's chunk for us at p * count. count defaults
        to the block from the rendezvous pointer, divided among the ranks.
        sm_free=True: one copy per peer on the copy engines, no kernel."""
        if _lib._forked_child:
            _lib._refuse_forked_child()
        w = "symmem.Handle.all_to_all"
        algo = _coll.sm_free_algo(None, sm_free, "all_to_all")
        code = _coll.dtype_code(dtype, "all_to_all")
        if count is None:
            count = (self.buffer_size - self.offset) // _coll.DTYPE_SIZES[code] // self.world_size
        count = int_arg(count, "count", w, C_SIZE)
        if algo is not None:
            rc = self._collective_fn(self.ptr, _coll.ALL_TO_ALL, code, 0, count, _coll.address(out, w),
                                     _coll.algo_code(algo, "all_to_all"), 0, _stream(stream, w))
        else:
            rc = _lib.calls().all_to_all(self.ptr, code, count, _coll.address(out, w), _stream(stream, w))
        if rc:
            check(rc, "symmem_all_to_all")

    def _a2a_args(self, w: str, row_bytes, out, out_rows, out_splits_offsets):
        return (
            int_arg(row_bytes, "row_bytes", w, C_SIZE),
            _coll.address(out, w),
            int_arg(out_rows, "out_rows", w, C_SIZE),
            _coll.address(out_splits_offsets, w, "out_splits_offsets"),
        )

    def all_to_all_v(self, row_bytes: int, in_splits, out, out_rows: int, out_splits_offsets, stream=0) -> None:
        """torch.ops.symm_mem.all_to_all_vdev: in_splits (W int64) rows of
        row_bytes bytes for each rank, taken from the input in rank order;
        out (room for out_rows rows) receives rank s's rows at row
        out_splits_offsets[W + s], out_splits_offsets[s] of them (a 2 x W
        int64 array, written by the call). Received rows past out_rows, or
        splits past the input or negative, are refused (InvalidArgumentError
        naming the rank; out untouched)."""
        if _lib._forked_child:
            _lib._refuse_forked_child()
        w = "symmem.Handle.all_to_all_v"
        rb, o, rows, oso = self._a2a_args(w, row_bytes, out, out_rows, out_splits_offsets)
        rc = _lib.lib().symmem_all_to_all_v(self.ptr, rb, _coll.address(in_splits, w, "in_splits"), o, rows, oso,
                                           _stream(stream, w))
        if rc:
            check(rc, "symmem_all_to_all_v")

    def all_to_all_v_2d(self, row_bytes: int, experts: int, in_splits, out, out_rows: int, out_splits_offsets,
                        major_align: int = 1, stream=0) -> None:
        """torch.ops.symm_mem.all_to_all_vdev_2d, the MoE dispatch: in_splits
        (S = W * experts int64) holds in_splits[p * experts + e] rows for
        local expert e of rank p, taken from the input in that order; out
        groups what arrives by our expert: index i = e * W + s (expert e,
        source rank s) in out_splits_offsets[i] (rows) and
        out_splits_offsets[S + i] (row offset). Each expert's rows start at
        a multiple of major_align, and an expert that receives nothing
        still takes major_align rows."""
        if _lib._forked_child:
            _lib._refuse_forked_child()
        w = "symmem.Handle.all_to_all_v_2d"
        rb, o, rows, oso = self._a2a_args(w, row_bytes, out, out_rows, out_splits_offsets)
        rc = _lib.lib().symmem_all_to_all_v_2d(
            self.ptr, rb, int_arg(experts, "experts", w, C_INT), _coll.address(in_splits, w, "in_splits"), o, rows,
            oso, int_arg(major_align, "major_align", w, C_INT64), _stream(stream, w))
        if rc:
            check(rc, "symmem_all_to_all_v_2d")

    def all_to_all_v_2d_offset(self, row_bytes: int, experts: int, in_splits_offsets, out, out_rows: int,
                               out_splits_offsets, stream=0) -> None:
        """torch.ops.symm_mem.all_to_all_vdev_2d_offset, the MoE combine
        (the dispatch's reverse): in_splits_offsets (2 x S int64, index
        i = e * W + p) holds the rows of source rank p's expert e (row 0)
        and their row offsets in the input (row 1, padding between them not
        sent); out receives them in rank-major order i = p * experts + e,
        packed, described in out_splits_offsets (2 x S)."""
        if _lib._forked_child:
            _lib._refuse_forked_child()
        w = "symmem.Handle.all_to_all_v_2d_offset"
        rb, o, rows, oso = self._a2a_args(w, row_bytes, out, out_rows, out_splits_offsets)
        rc = _lib.lib().symmem_all_to_all_v_2d_offset(
            self.ptr, rb, int_arg(experts, "experts", w, C_INT),
            _coll.address(in_splits_offsets, w, "in_splits_offsets"), o, rows, oso, _stream(stream, w))
        if rc:
            check(rc, "symmem_all_to_all_v_2d_offset")

    def all_reduce_rmsnorm(self, dtype, tokens: int, hidden: int, residual, weight, eps: float, out=None, stream=0,
                           *, algo: Optional[str] = None) -> None:
        """The end of a tensor-parallel decode layer, symmem_all_reduce_rmsnorm:
        the input (tokens x hidden elements at the rendezvous pointer) is
        all-reduced (sum, rank order, fp32, rounded once), added into
        residual (tokens x hidden, this rank's memory, written), and out
        (None: in place) gets rmsnorm(residual) * weight (hidden elements),
        every fp32 step rounded as include/symmem.h says, so that the bits
        are the same on every rank and backend. dtype: bfloat16, float16 or
        float32; hidden a multiple of 8 up to 16384. algo: "auto" (one
        kernel on the low-latency path where it fits, else the all-reduce
        then one add-and-norm kernel), "low_latency" (the one kernel, or
        InvalidArgumentError saying why not), "one_shot" or "two_shot" (the
        all-reduce of the two-kernel form). residual, weight and out: an
        int address, a Buffer or a tensor."""
        if _lib._forked_child:
            _lib._refuse_forked_child()
        w = "symmem.Handle.all_reduce_rmsnorm"
        code = _coll.dtype_code(dtype, "all_reduce_rmsnorm")
        tokens = int_arg(tokens, "tokens", w, C_SIZE)
        hidden = int_arg(hidden, "hidden", w, C_SIZE)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise TypeError(f"{w}: eps must be a float, not {brief(eps)}")
        res = _coll.address(residual, w, "residual")
        wt = _coll.address(weight, w, "weight")
        rc = _lib.lib().symmem_all_reduce_rmsnorm(
            self.ptr, code, tokens, hidden, res, wt, float(eps), _coll.address(out, w),
            _coll.algo_code(algo, "all_reduce_rmsnorm"), _stream(stream, w))
        if rc:
            check(rc, "symmem_all_reduce_rmsnorm")

    def device_error(self) -> int:
        """This rank's device error flag: 0, or 0x80000000 | cause << 29 |
        peer << 16 | set of the first kernel wait that gave up (cause 0: a
        timeout). Raises MismatchError when a peer called a collective with
        other arguments (cause 1) and PeerError when a peer's process exited
        during a wait (cause 2), naming the peer (symmem_handle_device_error)."""
        flag = ctypes.c_uint32()
        check(_lib.lib().symmem_handle_device_error(self.ptr, ctypes.byref(flag)), "symmem_handle_device_error")
        return int(flag.value)

    @property
    def nccl_window(self) -> Optional[Tuple[int, int]]:
        """(ncclWindow_t as an int, offset of the rendezvous pointer in it)
        on groups over an NCCL communicator with windows, else None."""
        win, off = ctypes.c_void_p(), ctypes.c_size_t()
        rc = _lib.lib().symmem_handle_nccl_window(self.ptr, ctypes.byref(win), ctypes.byref(off))
        if rc == Result.UNAVAILABLE:
            return None
        check(rc, "symmem_handle_nccl_window")
        return int(win.value or 0), int(off.value)

    def release(self) -> None:
        """Release the handle; peers' memory is unmapped when unused.

        The views from :meth:`get_buffer` and :meth:`get_signal_pad` and
        their memoryviews are released first: using them afterwards raises
        (InvalidStateError, or ValueError for a memoryview) instead of
        touching unmapped memory. If a memoryview is exported to another
        object (numpy, torch), InvalidStateError is raised and the handle
        stays alive: drop that object and release again.
        """
        for ref in self._views:
            view = ref()
            if view is not None:
                view._invalidate("its symmem.Handle was released")
        self._views.clear()
        self._ptr = None
        self._group = None
        owed = self._owned.take()
        if owed is not None:
            rc = _lib.lib().symmem_handle_release(*owed)
            if rc:
                check(rc, "symmem_handle_release")

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "" if self._ptr is not None else " released"
        return (
            f"<symmem.Handle rank={self.rank}/{self.world_size} buffer_size={self.buffer_size} "
            f"offset={self.offset}{state}>"
        )


_ptr_arrays: dict = {}  # length -> ctypes array of that many pointer-sized ints


def _ptr_lists(bufs: int, pads: int, world: int) -> Tuple[List[int], List[int]]:
    """The handle's arrays of world pointers at bufs and pads, as lists of
    ints: one read when the library keeps them end to end, as it does."""
    if not bufs or not pads:
        raise make_error(Result.INTERNAL, "symmem.Handle: the library returned no pointer array")
    if pads == bufs + ctypes.sizeof(ctypes.c_size_t) * world:
        both = _ptr_array(2 * world).from_address(bufs)[:]
        return both[:world], both[world:]
    arr = _ptr_array(world)
    return arr.from_address(bufs)[:], arr.from_address(pads)[:]


def _ptr_array(n: int):
    t = _ptr_arrays.get(n)
    if t is None:
        t = _ptr_arrays[n] = ctypes.c_size_t * n
    return t


def _address(buf_or_ptr) -> int:
    if isinstance(buf_or_ptr, Buffer):
        return buf_or_ptr.ptr
    if isinstance(buf_or_ptr, bool) or not hasattr(type(buf_or_ptr), "__index__"):
        raise TypeError(f"symmem.rendezvous: expected a Buffer or an int address, not {brief(buf_or_ptr)}")
    return int_arg(buf_or_ptr, "ptr", "symmem.rendezvous", C_PTR)


def rendezvous(buf_or_ptr: Union[Buffer, int], group: Group) -> Handle:
    """Collective: exchange this rank's block with every rank of group.

    buf_or_ptr is a Buffer from :func:`symmem.empty` or a pointer into a
    block from :func:`symmem.alloc` (on the group's device, allocated by the
    same sequence of calls on every rank). Raises MismatchError on every rank
    when ranks disagree on sizes, offsets, hosts or devices.
    """
    if not isinstance(group, Group):
        raise TypeError(f"symmem.rendezvous: expected a symmem.Group, not {type(group).__name__}")
    ptr = _address(buf_or_ptr)
    out = ctypes.c_void_p()
    rc = _lib.lib().symmem_rendezvous(ptr, group.ptr, ctypes.byref(out))
    group._raise_if(rc, "symmem_rendezvous")
    return Handle(int(out.value), group)
