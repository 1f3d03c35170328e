"""PyTorch helpers: the allocator object, MemPool, tensors on the heap,
rendezvous with torch.distributed groups, peer buffers as tensors.

Importing this module does not import torch; each function imports it when
called and raises RuntimeError saying what is missing (torch, or CUDA).

Global allocator (every CUDA tensor of the process comes from libsymmem)::

    import symmem.torch
    symmem.torch.use_as_global_allocator()   # before any CUDA allocation
    x = torch.randn(1024, device="cuda")

Inside a MemPool (PyTorch's caching allocator on top, libsymmem per segment)::

    pool = symmem.torch.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        x = torch.empty(1 << 20, device="cuda")

Symmetric tensors::

    t = symmem.torch.empty(1024, dtype=torch.float32)       # device: current
    h = symmem.torch.rendezvous(t, dist.group.WORLD)
    peer = h.get_buffer((rank + 1) % world, (1024,), torch.float32)
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
import re
import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _coll, _dlpack, _lib
from . import tags as _pause
from . import allocator as _alloc
from .buffer import Buffer
from .errors import brief
from .buffer import empty as _empty_buffer
from .exchange import KeyValueAllGather
from .group import Group, Handle
from .group import rendezvous as _rendezvous
from .snapshot import dump_snapshot, memory_snapshot, record_memory_history

__all__ = [
    "region",
    "tagged_pool",
    "pause",
    "resume",
    "allocator",
    "use_as_global_allocator",
    "mem_pool_allocator",
    "mem_pool",
    "empty",
    "as_tensor",
    "rendezvous",
    "group_for",
    "abort",
    "TorchHandle",
    "memory_stats",
    "memory_snapshot",
    "record_memory_history",
    "dump_snapshot",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "all_to_all_v",
    "all_to_all_v_2d",
    "all_to_all_v_2d_offset",
    "register_ops",
    "cpp_ops_info",
]

# torch's CUDAPluggableAllocator hooks and the symmem.h functions made for them.
_HOOKS = (
    ("set_init_fn", "symmem_init"),
    ("set_reset_fn", "symmem_reset"),
    ("set_memory_fraction_fn", "symmem_memory_fraction"),
    ("set_record_stream_fn", "symmem_record_stream"),
)

_global_allocator = None
# (process group name, device) -> (the process group, its Group). The process
# group is kept to notice a destroyed and re-created group of the same name.
_groups: Dict[Tuple[str, int, str], Tuple[Any, Group]] = {}
# process group name -> how many Groups this process made for it so far; every
# rank makes them in the same order, so the count names them alike everywhere.
_group_seq: Dict[str, int] = {}
_groups_lock = threading.Lock()


# --------------------------------------------------------------------------
# Requirements
# --------------------------------------------------------------------------


_torch_module = None


def _torch():
    """import torch, or RuntimeError saying it is missing. The first import
    also registers the collectives as torch operators (Note [Collectives as
    torch operators]), so that torch.compile finds them."""
    global _torch_module
    if _torch_module is not None:
        return _torch_module
    try:
        import torch
    except ImportError as exc:
        raise RuntimeError(
            "symmem.torch needs PyTorch, which cannot be imported here "
            f"({exc}); install torch to use these helpers"
        ) from exc
    _torch_module = torch
    _compiling(torch)  # keeps torch.compiler.is_compiling before anything is traced
    _register_ops(torch)
    return torch


def _torch_cuda():
    """torch with CUDA available, and libsymmem on its cuda backend."""
    torch = _torch()
    if not torch.cuda.is_available():
        raise RuntimeError(
            "symmem.torch: this needs CUDA, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda})"
        )
    _require_cuda_backend()
    return torch


def _require_cuda_backend() -> None:
    name = _alloc.backend_name()
    if name != "cuda":
        notes = _alloc.backend_notes().strip()
        raise RuntimeError(
            f"symmem.torch: libsymmem runs on its {name!r} backend, not 'cuda', so its memory "
            f"cannot back CUDA tensors" + (f" ({notes})" if notes else "")
            + "; check SYMMEM_BACKEND and the CUDA driver"
        )


# --------------------------------------------------------------------------
# The allocator objects
# --------------------------------------------------------------------------


def _pluggable(alloc_fn: str, hooks: bool):
    torch = _torch_cuda()
    lib = _lib.lib()
    for name in (alloc_fn, "symmem_free"):
        if not lib.has(name):
            raise RuntimeError(f"symmem.torch: {lib.path} does not export {name}")
    pluggable = torch.cuda.memory.CUDAPluggableAllocator(str(lib.path), alloc_fn, "symmem_free")
    if hooks:
        raw = pluggable.allocator()
        for setter, symbol in _HOOKS:
            set_fn = getattr(raw, setter, None)  # only what this torch exposes
            if set_fn is not None and lib.has(symbol):
                set_fn(lib.address(symbol))
    return pluggable


def allocator():
    """A CUDAPluggableAllocator for use as torch's *global* allocator.

    Its alloc function is ``symmem_alloc_or_throw``: a failure becomes a C++
    exception that torch turns into a Python RuntimeError carrying our
    message (a NULL would become a tensor at address 0). Its free function is
    ``symmem_free``, and torch's init / reset (empty_cache) / memory fraction /
    record_stream hooks are pointed at symmem_init, symmem_reset,
    symmem_memory_fraction and symmem_record_stream where this torch exposes
    them. Pass it to ``torch.cuda.memory.change_current_allocator`` before
    CUDA is initialised, or use :func:`use_as_global_allocator`.
    """
    return _pluggable("symmem_alloc_or_throw", hooks=True)


def use_as_global_allocator():
    """Make libsymmem torch's CUDA allocator for this process; returns it.

    Must be called before any CUDA allocation (before CUDA is initialised in
    torch): torch cannot swap the allocator afterwards. Note that with a
    pluggable allocator ``torch.cuda.memory_stats()`` is not available; use
    :func:`memory_stats`.
    """
    global _global_allocator
    torch = _torch_cuda()
    if _global_allocator is not None:
        return _global_allocator
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "symmem.torch.use_as_global_allocator: CUDA is already initialised in this process, "
            "so torch's allocator can no longer be changed; call it first thing, before any "
            "CUDA tensor or torch.cuda call that initialises CUDA"
        )
    a = allocator()
    torch.cuda.memory.change_current_allocator(a)
    _global_allocator = a
    return a


def mem_pool_allocator():
    """A CUDAPluggableAllocator for ``torch.cuda.MemPool``.

    Its alloc function is ``symmem_alloc``, which returns NULL on failure:
    inside a MemPool torch's caching allocator treats NULL as out-of-memory
    (frees cached blocks, retries, raises torch.OutOfMemoryError).
    """
    return _pluggable("symmem_alloc", hooks=False)


def mem_pool(**kwargs):
    """A ``torch.cuda.MemPool`` whose segments come from libsymmem.

    Keyword arguments go to torch.cuda.MemPool (e.g. use_on_oom).
    """
    torch = _torch_cuda()
    return torch.cuda.MemPool(mem_pool_allocator().allocator(), **kwargs)


# --------------------------------------------------------------------------
# Tensors on the heap
# --------------------------------------------------------------------------


def _backend_device(torch, device) -> Any:
    """Resolve device (None/int/str/torch.device) against the backend."""
    backend = _alloc.backend_name()
    if device is None:
        if backend == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    if isinstance(device, int):
        device = torch.device("cuda", device) if backend == "cuda" else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda":
        _require_cuda_backend()
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    elif device.type == "cpu":
        if backend != "host":
            raise RuntimeError(
                f"symmem.torch: libsymmem runs on its {backend!r} backend; CPU tensors need the host backend"
            )
    else:
        raise RuntimeError(f"symmem.torch: unsupported device {brief(device)}")
    return device


def _symmem_device(device) -> int:
    """The libsymmem device index of a torch device."""
    return device.index if device.type == "cuda" else 0


def _itemsize(torch, dtype) -> int:
    size = getattr(dtype, "itemsize", None)
    if size is None:  # torch < 2.1
        size = torch.empty((), dtype=dtype).element_size()
    return int(size)


def as_tensor(buf: Buffer, device=None):
    """A 1-D uint8 tensor aliasing buf's memory (buf stays alive with it).

    device defaults to buf's device (``cuda:<buf.device>`` on the cuda
    backend, cpu on the host backend).
    """
    torch = _torch()
    if device is None:
        device = torch.device("cuda", buf.device) if buf.kind == "cuda" else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda":
        cap = _dlpack.capsule(buf.ptr, buf.nbytes, _dlpack.KDL_CUDA, device.index, buf)
    else:
        if buf.kind != "host":
            raise RuntimeError(f"symmem.torch.as_tensor: {buf.kind} memory cannot back a CPU tensor")
        cap = _dlpack.capsule(buf.ptr, buf.nbytes, _dlpack.KDL_CPU, 0, buf)
    return torch.utils.dlpack.from_dlpack(cap)


def _shape(torch, size: Sequence) -> Tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    return tuple(int(s) for s in size)


def empty(*size, dtype=None, device=None):
    """An uninitialised tensor on libsymmem's heap (torch.empty's shape args).

    device: None (the current CUDA device on the cuda backend, cpu on the
    host backend), an int, a string or a torch.device. The memory is freed
    when the tensor (and every view of it) is gone. On CUDA it is allocated
    and freed on the device's current stream.
    """
    torch = _torch()
    dtype = dtype or torch.float32
    shape = _shape(torch, size)
    dev = _backend_device(torch, device)
    nbytes = math.prod(shape) * _itemsize(torch, dtype)
    if dev.type == "cuda":
        stream = torch.cuda.current_stream(dev).cuda_stream
        buf = _empty_buffer(nbytes, dev.index, stream)
    else:
        buf = _empty_buffer(nbytes, 0)
    return as_tensor(buf, dev).view(dtype).view(shape)


# --------------------------------------------------------------------------
# Groups from torch.distributed
# --------------------------------------------------------------------------


def _process_group_store(dist, pg):
    c10d = dist.distributed_c10d
    getter = getattr(c10d, "_get_process_group_store", None)
    if getter is not None:
        return getter(pg)
    world = getattr(c10d, "_world", None)
    if world is not None and pg in world.pg_map:
        return world.pg_map[pg][1]
    # The same prefix on every rank: the ranks must see each other's keys.
    return dist.PrefixStore(f"symmem-pg-{_sanitize(str(getattr(pg, 'group_name', '')))}", c10d._get_default_store())


def _sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:40] or "pg"


def _nccl_backend(torch, pg):
    """pg's ProcessGroupNCCL (the backend for CUDA tensors), or None."""
    try:
        backend = pg._get_backend(torch.device("cuda"))
    except Exception:  # no CUDA backend in this group
        return None
    return backend if hasattr(backend, "_comm_ptr") else None


def _nccl_comm_ptr(torch, pg, backend, device: int) -> int:
    """The ncclComm_t that pg's NCCL backend uses on device.

    ProcessGroupNCCL makes its communicator lazily, at the first collective,
    unless the process group was created with device_id= (eager init): a
    communicator that does not exist yet is a clear error, not a hang."""
    try:
        with torch.cuda.device(device):
            ptr = int(backend._comm_ptr())
    except Exception as exc:  # torch says "not found"/"not initialized"
        ptr, cause = 0, exc
    else:
        cause = None
    if ptr == 0:
        msg = (
            f"symmem.torch: the NCCL communicator of process group {getattr(pg, 'group_name', pg)!r} does not "
            f"exist yet on cuda:{device}. Create it eagerly with "
            f"torch.distributed.init_process_group('nccl', device_id=torch.device('cuda', {device})) "
            f"(or run one collective on the group first), or pass nccl=False to use the group's store"
        )
        raise RuntimeError(msg) from cause
    return ptr


def group_for(
    group=None,
    device: int = 0,
    timeout: Optional[float] = None,
    nccl: Optional[bool] = None,
    nccl_windows: bool = True,
) -> Group:
    """The symmem.Group of a torch.distributed process group (collective
    the first time for a (group, device, kind) triple; cached afterwards).

    group: a ProcessGroup, a group name, None (the default group), or a
    symmem.Group (returned as is).

    With an NCCL process group (nccl=None, the default, picks it when the
    group has an NCCL backend and libsymmem runs on the cuda backend;
    nccl=True requires it), the group lives on the process group's own
    communicator (ProcessGroupNCCL's ``_comm_ptr()``; the process group must
    have been created with ``device_id=``, or have run a collective, so that
    the communicator exists): records are all-gathered through NCCL and,
    with nccl_windows (the default), every rendezvous registers the tensor's
    segment as an NCCL symmetric window (NCCL_WIN_COLL_SYMMETRIC), once per
    segment, so NCCL collectives on the tensor take NCCL's symmetric path.
    nccl_windows=False registers no window. The group's all-gathers run
    before any registration, so registration is never the first NCCL
    operation on the communicator (pytorch issue 188567).

    Otherwise (nccl=False, or a gloo group) small records go through the
    process group's key-value store (:class:`symmem.KeyValueAllGather`): a
    store works for every backend, needs no device tensors and launches no
    NCCL work. File descriptors always travel over libsymmem's Unix socket
    channel.

    The process group may span machines (torchrun on several nodes): the
    returned group's ``local_rank``, ``local_size`` and ``is_local(rank)``
    describe this machine's ranks, the only ones whose memory is mapped here
    (``get_buffer`` of another machine's rank raises, naming it). On an NCCL
    process group, collectives, barriers and signals to the other machines
    go through its communicator (docs/machines.md); on a store-based group
    they are UnavailableError, naming the missing engine.
    """
    if isinstance(group, Group):
        return group
    torch = _torch()
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("symmem.torch: torch.distributed is not initialised (call init_process_group first)")
    if group is None:
        pg = dist.group.WORLD
    elif isinstance(group, str):
        pg = dist.distributed_c10d._resolve_process_group(group)
    else:
        pg = group
    pg_name = dist.distributed_c10d._get_process_group_name(pg) if hasattr(
        dist.distributed_c10d, "_get_process_group_name"
    ) else getattr(pg, "group_name", "")
    backend = None
    if nccl is not False:
        backend = _nccl_backend(torch, pg) if _alloc.backend_name() == "cuda" else None
        if backend is None and nccl:
            raise RuntimeError(
                f"symmem.torch: nccl=True, but process group {pg_name!r} has no NCCL backend "
                f"or libsymmem runs on its {_alloc.backend_name()!r} backend"
            )
    kind = "store" if backend is None else ("nccl" if nccl_windows else "nccl-nowin")
    key = (str(pg_name), int(device), kind)
    with _groups_lock:
        entry = _groups.get(key)
        if entry is not None and entry[0] is pg:
            return entry[1]
        rank, world = dist.get_rank(pg), dist.get_world_size(pg)
        store = _process_group_store(dist, pg)
        # Every rank must derive the same name, and ranks sit on different
        # devices, so the device is not part of it. A token from rank 0 keeps
        # the socket names of two jobs on one host (both with a group "0")
        # apart; seq separates successive Groups of one process group name.
        seq = _group_seq.get(str(pg_name), 0)
        _group_seq[str(pg_name)] = seq + 1
        pg_part = _sanitize(str(pg_name))
        token_key = f"symmem/{pg_part}/{seq}/token"
        if rank == 0:
            store.set(token_key, os.urandom(6).hex())
        token = store.get(token_key).decode()
        name = f"t{token}-{pg_part}-{seq}"
        if backend is not None:
            comm = _nccl_comm_ptr(torch, pg, backend, device)
            g = Group.from_nccl(comm, name, timeout=timeout, windows=nccl_windows)
        else:
            gather = KeyValueAllGather(store, rank, world, prefix=f"symmem/{name}")
            g = Group(name, rank, world, device=device, timeout=timeout, allgather=gather)
        _groups[key] = (pg, g)
        return g


def abort(group=None) -> None:
    """Abort a process group and the symmem groups made for it.

    Every symmem.Group that :func:`group_for` made for ``group`` (a
    ProcessGroup, a group name, None for the default group, or a
    symmem.Group) is aborted (:meth:`symmem.Group.abort`: its waits return,
    later calls raise AbortedError), then the process group itself where
    torch offers an abort (``ProcessGroup.abort()``, or
    ``torch.distributed.distributed_c10d._abort_process_group``); without one
    only the symmem groups are aborted. Safe from any thread. Importable and
    callable with a symmem.Group without torch.
    """
    if isinstance(group, Group):
        group.abort()
        return
    torch = _torch()
    dist = torch.distributed
    pg = _process_group_of(dist, group)
    with _groups_lock:
        mine = [g for (p, g) in _groups.values() if p is pg]
    for g in mine:
        g.abort()
    pg_abort = getattr(pg, "abort", None)
    if callable(pg_abort):
        pg_abort()
        return
    c10d_abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if callable(c10d_abort):
        c10d_abort(pg)


def _process_group_of(dist, group):
    """The ProcessGroup that group names (None: the default group)."""
    if group is None:
        return dist.group.WORLD
    if isinstance(group, str):
        return dist.distributed_c10d._resolve_process_group(group)
    return group


def destroy_group(group=None) -> None:
    """Collective: release what symmem.torch holds for a process group and
    destroy the symmem Groups that :func:`group_for` made for it.

    group: a ProcessGroup, a group name, or None for the default group.
    Every rank calls it, at the same point, before
    ``torch.distributed.destroy_process_group(group)``: the handles of the
    tensors rendezvoused in the group (by :func:`rendezvous` or by a
    collective), the group's staging workspace and the symmem Groups are
    released in the order they were made, which deregisters their NCCL
    windows and destroys the communicators split from the process group's
    while that communicator still lives. TorchHandles of the group, and
    the workspaces of its fused tensor-parallel operators, are released
    with it (their calls raise afterwards); tensors stay valid.
    A later collective or rendezvous on the group makes a new symmem Group.
    """
    torch = _torch()
    pg = _process_group_of(torch.distributed, group)
    with _groups_lock:
        keys = [k for k, (p, _) in _groups.items() if p is pg]
        mine = [_groups.pop(k)[1] for k in keys]
    if not mine:
        return
    ids = {id(g) for g in mine}
    with _staging_lock:
        for k in [k for k, e in _staging.items() if id(e[2].group) in ids]:
            del _staging[k]
        for i in ids:
            _workspaces.pop(i, None)
    for k in [k for k, e in _fast.items() if e[4]._lease is not None and id(e[4]._lease[2]) in ids]:
        _fast.pop(k, None)
    for k in [k for k in _coll_handles if k[0] in ids]:
        _coll_handles.pop(k, None)
    for k in [k for k in _tp_workspaces if k[0] in ids]:
        _tp_workspaces.pop(k, None)
    for k in [k for k, e in _groups_by_call.items() if id(e[2]) in ids]:
        _groups_by_call.pop(k, None)
    for k in [k for k, e in _in_place.items() if id(e[0].group) in ids]:
        _in_place.pop(k, None)
    _cpp_forget(0)
    with _rendezvous_lock:
        leases = [(k, lease) for k, lease in _rendezvous_cache.items() if id(lease[2]) in ids]
        for k, _ in leases:
            del _rendezvous_cache[k]
        for k in [k for k, e in _rendezvous_fast.items() if id(e[2][2]) in ids]:
            del _rendezvous_fast[k]
    for _, lease in leases:
        lease[1] = 0  # the TorchHandles' own release() then releases nothing
        if lease[0]._ptr is not None:
            lease[0].release()
    for g in mine:
        g.destroy()


class TorchHandle:
    """A symmem.Handle whose buffers are torch tensors.

    Everything of :class:`symmem.Handle` is available (rank, world_size,
    buffer_ptrs, signal_pad_ptrs, buffer_size, offset, barrier, put_signal,
    wait_signal, release, ...). Signal calls default to torch's current CUDA
    stream on the cuda backend.
    """

    def __init__(self, handle: Handle, device, lease: Optional[list] = None):
        self.handle = handle
        self.device = device
        self._lease = lease  # the _rendezvous_cache entry this handle holds one of (Note [Rendezvous again])

    def __getattr__(self, name: str):
        return getattr(self.handle, name)

    def _stream(self, stream):
        if stream is not None:
            return stream
        if self.device.type == "cuda":
            torch = _torch_module or _torch()
            index = self.device.index
            return (_raw_stream or _raw_stream_fn(torch))(torch.cuda.current_device() if index is None else index)
        return 0

    def get_buffer(self, rank: int, sizes: Union[int, Sequence[int]] = None, dtype=None, storage_offset: int = 0):
        """A tensor aliasing rank's memory, mapped in this process.

        Like torch's SymmetricMemory.get_buffer: sizes and dtype describe the
        tensor, storage_offset (in elements of dtype) where it starts,
        counted from the rendezvous pointer (the peer's equivalent of the
        tensor given to rendezvous). Without sizes: every byte from there to
        the end of the block, as uint8.
        """
        torch = _torch()
        dtype = dtype or torch.uint8
        item = _itemsize(torch, dtype)
        if sizes is None:
            avail = self.handle.buffer_size - self.handle.offset - storage_offset * item
            shape: Tuple[int, ...] = (avail // item,)
        else:
            shape = (int(sizes),) if isinstance(sizes, int) else tuple(int(s) for s in sizes)
        view = self.handle.get_buffer(rank, math.prod(shape) * item, storage_offset * item)
        return as_tensor(view, self.device).view(dtype).view(shape)

    def get_signal_pad(self, rank: int, sizes=None, dtype=None):
        """rank's signal pad as a tensor (default: int32 slots)."""
        torch = _torch()
        dtype = dtype or torch.int32
        view = self.handle.get_signal_pad(rank)
        t = as_tensor(view, self.device).view(dtype)
        return t if sizes is None else t.view(tuple(sizes) if not isinstance(sizes, int) else (sizes,))

    def put_signal(self, dst_rank: int, channel: int = 0, stream=None) -> None:
        self.handle.put_signal(dst_rank, channel, self._stream(stream))

    def wait_signal(self, src_rank: int, channel: int = 0, timeout: Optional[float] = None, stream=None) -> None:
        self.handle.wait_signal(src_rank, channel, timeout, self._stream(stream))

    def barrier(self, channel: int = 0, timeout: Optional[float] = None, stream=None) -> None:
        self.handle.barrier(channel, timeout, self._stream(stream))

    def release(self) -> None:
        """Release this handle. The handles that :func:`rendezvous` gave
        for one tensor and group share one symmem.Handle (Note
        [Rendezvous again]): it, and the views of it, are released with
        the last of them."""
        lease, self._lease = self._lease, None
        if lease is None:
            if self.__dict__.get("_released"):
                return
            self._released = True
            self.handle.release()
            return
        self._released = True
        with _rendezvous_lock:
            lease[1] -= 1
            last = lease[1] == 0
            if last and _rendezvous_cache.get(lease[3]) is lease:
                del _rendezvous_cache[lease[3]]
        if last:
            lease[0].release()

    def __enter__(self) -> "TorchHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<symmem.torch.TorchHandle {self.handle!r} device={self.device}>"


def rendezvous(
    tensor,
    group=None,
    timeout: Optional[float] = None,
    *,
    nccl: Optional[bool] = None,
    nccl_windows: bool = True,
) -> TorchHandle:
    """Collective: rendezvous on a tensor from :func:`empty` (or any tensor
    whose memory lies in a libsymmem block) with every rank of group.

    group: a symmem.Group, a torch.distributed ProcessGroup or group name, or
    None for the default group (see :func:`group_for`). With an NCCL process
    group the rendezvous runs over its communicator and registers the
    tensor's segment as an NCCL symmetric window (nccl_windows=False: no
    window; nccl=False: the store-based group, no NCCL at all)::

        dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
        t = symmem.torch.empty(n, dtype=torch.bfloat16)
        h = symmem.torch.rendezvous(t)      # window registered
        dist.all_reduce(t)                  # NCCL's symmetric kernels
    """
    torch = _torch_module or _torch()
    plain = timeout is None and nccl is None and nccl_windows is True
    if plain:
        # Again, with the handle held (Note [Rendezvous again]): the lease
        # found under the arguments themselves, as _fast finds a
        # collective's handle, without resolving the process group again.
        gkey = _group_key(group)
        fkey = (gkey, tensor.get_device(), tensor.data_ptr(), tensor.nbytes)
        e = _rendezvous_fast.get(fkey)
        if e is not None and _entry_current(e, group, torch):
            lease = e[2]
            with _rendezvous_lock:
                if _rendezvous_cache.get(lease[3]) is lease and lease[0]._ptr is not None:
                    lease[1] += 1
                    return TorchHandle(lease[0], tensor.device, lease)
    device = tensor.device
    if device.type not in ("cuda", "cpu"):
        raise RuntimeError(f"symmem.torch.rendezvous: unsupported device {brief(device)}")
    g = group_for(group, _symmem_device(device), timeout, nccl=nccl, nccl_windows=nccl_windows)
    key = (id(g), int(tensor.data_ptr()), tensor.numel() * tensor.element_size())
    with _rendezvous_lock:
        lease = _rendezvous_cache.get(key)
        if lease is None or lease[2] is not g or lease[0]._ptr is None:
            lease = None
        else:
            lease[1] += 1
    if lease is None:
        h = _rendezvous(key[1], g)
        lease = [h, 1, g, key]
        with _rendezvous_lock:
            _rendezvous_cache[key] = lease
        weakref.finalize(tensor, _forget_rendezvous, key, lease)
    if plain:
        pg = _world_pg(torch.distributed) if group is None else None
        _rendezvous_fast[fkey] = (group, pg, lease)
        weakref.finalize(tensor, _forget_rendezvous_fast, fkey, lease)
    return TorchHandle(lease[0], device, lease)


# Note [Rendezvous again]
#
# torch's rendezvous of a tensor it has rendezvoused before returns the
# handle it keeps, with no exchange between the ranks; libsymmem's C
# rendezvous exchanges the ranks' records again to check that they agree.
# symmem.torch.rendezvous keeps what was agreed instead: while a handle of
# a (group, tensor) pair is live, a rendezvous again returns another
# TorchHandle of the same symmem.Handle (a lease: [handle, leases, group,
# key]), locally, as torch does; the handle is released with its last
# lease. So, as with torch, every rank must rendezvous again where every
# other does (a rank that released its last handle exchanges again, and
# waits for the others in that exchange). The entry goes when the tensor
# does; leases still held keep the handle.
_rendezvous_cache: Dict[Tuple[int, int, int], list] = {}
_rendezvous_lock = threading.Lock()
# A rendezvous again with the default arguments finds its lease here, under
# (group argument: None, a name, or the id of the group object; device
# index, data_ptr, nbytes) -> (group argument, the default process
# group then or None, lease): the lookups of _fast (Note [Eager
# collectives]), so that a re-created default group is noticed. The lease
# is used only while it is the cache's entry and its handle is live.
_rendezvous_fast: Dict[Tuple[Any, int, int, int], Tuple[Any, Any, list]] = {}


def _forget_rendezvous(key, lease) -> None:
    with _rendezvous_lock:
        if _rendezvous_cache.get(key) is lease:
            del _rendezvous_cache[key]


def _forget_rendezvous_fast(key, lease) -> None:
    e = _rendezvous_fast.get(key)
    if e is not None and e[2] is lease:
        del _rendezvous_fast[key]


def memory_stats(device=None) -> Dict[str, int]:
    """libsymmem's statistics for device, keyed and sorted like
    ``torch.cuda.memory_stats`` (which a pluggable allocator lacks)."""
    if device is None:
        idx = 0
        if _alloc.backend_name() == "cuda":
            torch = _torch()
            if torch.cuda.is_available():  # else device 0 (a torch built without CUDA, or none visible to it)
                idx = torch.cuda.current_device()
    elif isinstance(device, int):
        idx = device
    else:
        torch = _torch()
        dev = torch.device(device)
        idx = dev.index if dev.type == "cuda" and dev.index is not None else (
            torch.cuda.current_device() if dev.type == "cuda" else 0
        )
    return dict(sorted(_alloc.memory_stats(idx).items()))


# --------------------------------------------------------------------------
# Tags and pause (symmem.pause): the same calls, with torch's groups
# --------------------------------------------------------------------------

region = _pause.region


_tag_pools: dict = {}


@contextlib.contextmanager
def tagged_pool(tag: str, backup: bool = False, **pool_kwargs):
    """Allocate inside a ``torch.cuda.MemPool`` of libsymmem that holds tag
    ``tag`` only: ``with symmem.torch.tagged_pool("weights", backup=True):``
    opens the tag's pool (one per tag, made on first use and kept; keyword
    arguments go to it then) and a region of the tag on this thread, and
    yields the pool. torch caches freed blocks inside the pool, so a tag's
    blocks never serve another tag, and pause/resume act on the whole pool.
    """
    torch = _torch_cuda()
    pool = _tag_pools.get(tag)
    if pool is None:
        pool = _tag_pools[tag] = mem_pool(**pool_kwargs)
    with torch.cuda.use_mem_pool(pool), region(tag, backup=backup):
        yield pool


def _pause_group(group, device):
    if group is None:
        return None
    return group_for(group, device=device)


def pause(tag: Optional[str] = None, group=None, device: int = 0) -> None:
    """symmem.pause: release ``tag``'s memory (None: every tag) at the same
    addresses. Tensors, and CUDA graphs that captured them, stay valid but
    must not be used until :func:`resume`. ``group``: a ProcessGroup, a group
    name or a symmem.Group (see :func:`group_for`; the rendezvous' group):
    collective on its ranks."""
    _pause.pause(tag, group=_pause_group(group, device))


def resume(tag: Optional[str] = None, group=None, device: int = 0) -> None:
    """symmem.resume: take ``tag``'s memory back at the same addresses
    (contents restored with backup, zero without)."""
    _pause.resume(tag, group=_pause_group(group, device))


# --------------------------------------------------------------------------
# Collectives on tensors (names and semantics of torch.ops.symm_mem and
# torch.distributed: all_reduce in place, all_gather_into_tensor,
# reduce_scatter_tensor)
# --------------------------------------------------------------------------

# (id of the symmem Group, data_ptr, nbytes) -> TorchHandle of a tensor that
# a collective rendezvoused on; dropped (and released) when the tensor dies.
_coll_handles: Dict[Tuple[int, int, int], TorchHandle] = {}


def _drop_coll_handle(key) -> None:
    h = _coll_handles.pop(key, None)
    if h is not None:
        try:
            h.release()
        except Exception:  # noqa: BLE001 - at tensor death, nothing to report to
            pass


def _owner(tensor):
    """The tensor whose life bounds tensor's memory: the base of a view
    (which the view keeps alive), else tensor itself. Caches keyed by a
    view's pointer live as long as it, so a call on a fresh view of the
    same buffer (buf[:n] at every step, or inside a CUDA-graph capture,
    where a rendezvous cannot run) finds what the first call resolved."""
    while tensor._base is not None:
        tensor = tensor._base
    return tensor


def _coll_handle(tensor, group) -> TorchHandle:
    """The handle of tensor in group: a rendezvous (collective) at the first
    collective on the tensor, reused while the tensor lives."""
    if not tensor.is_contiguous():
        raise ValueError("symmem.torch collectives need a contiguous tensor")
    g = group_for(group, _symmem_device(tensor.device))
    key = (id(g), int(tensor.data_ptr()), tensor.numel() * tensor.element_size())
    h = _coll_handles.get(key)
    if h is None:
        h = rendezvous(tensor, g)
        _coll_handles[key] = h
        weakref.finalize(_owner(tensor), _drop_coll_handle, key)
    return h


def _current_stream(tensor) -> int:
    if tensor.device.type == "cuda":
        return _torch().cuda.current_stream(tensor.device).cuda_stream
    return 0


# Note [Eager collectives]
#
# Most training loops call collectives uncaptured, so each call costs its
# Python and C path on top of the kernel's launch. The first call on a
# (group, tensor) pair resolves everything a call needs (the symmem Group of
# the process group, the rendezvous on the tensor, the handle's pointer and
# world size) and keeps it in _fast under (id of the group argument,
# device, data_ptr, nbytes); later calls look that up, read the current
# stream through torch's raw-stream accessor and call symmem_collective
# directly, with dtype, op and algo codes from dicts: no process-group
# lookup, no rendezvous check, no exception-driven dtype parsing. The entry
# keeps the group argument itself (and, for the default group, the process
# group it was), so a recycled id or a re-created default group is noticed
# and the slow path runs again (which finds the process group anew). An
# entry lives as long as the tensor that owns the memory (a view's base:
# _owner), so a fresh view of one buffer at every call (buf[:n]) finds it,
# also inside a CUDA-graph capture, where no rendezvous can run. A tensor
# of torch's memory that a call on the default group read in place (Note
# [Staging]) is kept the same way in _in_place, so that its next call of
# that collective skips the pointer lookup and the workspace's checks.
# Under torch.compile the same calls go
# through the torch.library operators below instead.

# (group argument: None, a name, or the id of a process group; device
# index, data_ptr, nbytes) -> (group argument, the default process group
# then or None, handle pointer, world size, TorchHandle)
_fast: Dict[Tuple[Any, int, int, int], Tuple[Any, Any, int, int, Any]] = {}
_fast_codes: Dict[Any, int] = {}
_raw_stream = None
_collective_fn = None


def _codes(torch) -> Dict[Any, int]:
    if not _fast_codes:
        for name, code in _coll.DTYPES.items():
            dt = getattr(torch, name, None)
            if dt is not None:
                _fast_codes[dt] = code
    return _fast_codes


def _raw_stream_fn(torch):
    """device index -> the current stream's cudaStream_t as an int."""
    global _raw_stream
    if _raw_stream is None:
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _raw_stream = raw if raw is not None else (lambda i: torch.cuda.current_stream(i).cuda_stream)
    return _raw_stream


_c10d_world = None


def _world_pg(dist):
    """The default process group, or None; read through c10d's world
    object where it has one (kept: an attribute read rather than two
    calls)."""
    global _c10d_world
    world = _c10d_world
    if world is None:
        world = _c10d_world = getattr(dist.distributed_c10d, "_world", None)
    if world is not None:
        return world.default_pg
    return dist.group.WORLD if dist.is_initialized() else None


def _group_key(group):
    """The key a group argument is kept under in the per-call tables: None,
    a name, or the id of the group object (whose entry keeps the object,
    so the id is not reused meanwhile)."""
    return group if group is None or isinstance(group, str) else id(group)


def _entry_current(e, group, torch) -> bool:
    """Whether e, an entry kept under _group_key(group) as (group argument,
    the default process group then or None, ...), is still this group's:
    the same object (a name stands for itself), and for the default group
    the same default process group (a re-created one is noticed)."""
    return (e[0] is group or isinstance(group, str)) and (group is not None or e[1] is _world_pg(torch.distributed))


def _fast_entry(torch, tensor, group, dev=None):
    """The _fast entry of (group, tensor), made on first use (Note [Eager
    collectives])."""
    if dev is None:
        dev = tensor.get_device()
    gkey = _group_key(group)
    key = (gkey, dev, tensor.data_ptr(), tensor.nbytes)
    e = _fast.get(key)
    if e is not None and _entry_current(e, group, torch):
        return e
    th = _coll_handle(tensor, group)
    pg = _world_pg(torch.distributed) if group is None else None
    e = (group, pg, int(th.handle.ptr), th.handle.world_size, th)
    _fast[key] = e
    weakref.finalize(_owner(tensor), _fast.pop, key, None)
    return e


def _is_symmem(t) -> bool:
    """Whether t's memory is libsymmem's: the call module's lookup, which
    answers without building the error that pointer_info would raise."""
    return _lib.calls().is_symmem(t.data_ptr())


def _run(what: str, coll: int, tensor, group, op: str, out, algo, cpp_group: Optional[str] = None) -> None:
    """One collective call on the eager path: the fewest attribute reads
    and calls that resolve it (Note [Eager collectives]); a tensor that
    libsymmem did not allocate, or that is not contiguous, goes through
    the group's staging workspace (Note [Staging]). cpp_group: the
    operator's group name when the C++ kernel passed the call here, which
    then enters what served it in the kernel's table (Note [Operators in
    C++])."""
    global _collective_fn, _collective_from_fn
    torch = _torch_module or _torch()
    dev = tensor.get_device()
    e = d = None
    if group is None:  # the common case, inline: the default group
        ptr = tensor.data_ptr()
        e = _fast.get((None, dev, ptr, tensor.nbytes))
        if e is not None and e[1] is not _world_pg(torch.distributed):
            e = None
        if e is None and algo is None:
            # A tensor of torch's memory read in place at an earlier call
            # of this collective (Note [Staging]): its workspace handle.
            d = _in_place.get((dev, ptr, tensor.nbytes, coll))
            if d is not None and (d[1] is not _world_pg(torch.distributed) or not tensor.is_contiguous() or (
                    out is not None and (not out.is_contiguous() or out.data_ptr() % 16))):
                d = None
    fn = _collective_fn
    if fn is None:
        fn = _collective_fn = _lib.calls().collective
    if e is None and d is None:
        if tensor.numel() and (not tensor.is_contiguous() or not _is_symmem(tensor)):
            _run_staged(torch, what, coll, tensor, group, op, out, algo, dev, cpp_group)
            return
        if not tensor.is_contiguous():
            raise ValueError(f"symmem.torch.{what} needs a contiguous tensor")
        e = _fast_entry(torch, tensor, group, dev)
    code = (_fast_codes or _codes(torch)).get(tensor.dtype)
    if code is None:
        code = _coll.dtype_code(tensor.dtype, what)  # raises, naming the known dtypes
    opc = _OPS.get(op)
    if opc is None:
        opc = _coll.op_code(op, what)
    stream = (_raw_stream or _raw_stream_fn(torch))(dev) if dev >= 0 else 0
    if d is not None:
        frm = _collective_from_fn
        if frm is None:
            frm = _collective_from_fn = _lib.calls().collective_from
        rc = frm(d[0].hptr, coll, code, opc, tensor.numel(), ptr, None if out is None else out.data_ptr(), 0, 0, stream)
    else:
        algoc = 0 if algo is None else _coll.algo_code(algo, what)
        rc = fn(e[2], coll, code, opc, tensor.numel(), None if out is None else out.data_ptr(), algoc, 0, stream)
    if rc:
        _lib.check(rc, f"symmem.torch.{what}")
    if cpp_group is not None and tensor.numel():
        if d is not None:
            _cpp_remember(cpp_group, tensor, coll, d[0].hptr, _CPP_READ_IN_PLACE, d[0].world)
        else:
            _cpp_remember(cpp_group, tensor, coll, e[2], _CPP_ZERO_COPY, e[3])


# Note [Staging]
#
# A collective on a tensor that libsymmem did not allocate (x * 2, a
# tensor of torch's allocator, the copy that functionalization makes under
# torch.compile) cannot rendezvous on it. A call that fits the
# low-latency path (at most symmem_low_latency_max_bytes per rank and peer,
# contiguous, 16-byte aligned, auto or low_latency) needs no copy at all:
# that path reads each rank's input on that rank only, so the library takes
# the tensor where it lies (symmem_collective_from; Note [Inputs outside
# the block] in core/symm/coll), and the workspace serves only as a handle
# of the group. Anything larger goes through the group's staging workspace,
# as the serving stacks' custom all-reduces do:
# one symmetric uint8 buffer per symmem Group, rendezvoused once, that the
# call copies its input into (on the current stream) and runs on, writing
# the result straight into the destination (all_reduce up to
# _STAGED_DIRECT_MAX bytes and every all_gather / reduce_scatter: out may be
# any memory of the device) or reducing in place in the workspace and
# copying back (larger all-reduces, which take two-shot there). Its first
# size is SYMMEM_STAGING_BYTES (1 MiB); a call that needs more grows it to
# the next power of two that holds the call: a rendezvous, so collective,
# and every rank grows at the same call because every rank calls with the
# same count. Growing cannot happen inside CUDA-graph capture (the
# rendezvous is host work between the ranks): there the call raises,
# naming the size to set. A workspace that was outgrown stays allocated and
# rendezvoused for the group's life, since CUDA graphs captured with it
# still address it. Calls of one group share the workspace, which is why
# they must be ordered (one stream), as collectives on one channel must be
# anyway. A libsymmem tensor keeps the zero-copy path.

_STAGING_DEFAULT = 1 << 20
_STAGED_DIRECT_MAX = 1 << 20


class _Workspace:
    """A group's staging workspace: the uint8 tensor, its TorchHandle and
    handle pointer, its size, and the outgrown workspaces kept alive."""

    __slots__ = ("group", "tensor", "handle", "hptr", "world", "nbytes", "outgrown", "views", "ll_bytes")

    def __init__(self, group: Group, tensor, handle, outgrown: list):
        self.group = group
        self.tensor = tensor
        self.handle = handle
        self.hptr = int(handle.handle.ptr)
        self.world = handle.handle.world_size
        self.nbytes = tensor.numel()
        self.outgrown = outgrown
        # Bytes per rank and peer that run from the caller's tensor with no
        # copy (Note [Inputs outside the block] in core/symm/coll); 0: none.
        self.ll_bytes = _ll_bytes(handle)
        self.views: Dict[Tuple[Any, Any], Any] = {}  # (dtype, shape) -> the workspace's start as such a tensor

    def view(self, dtype, shape, nbytes: int):
        """The workspace's first nbytes as a contiguous tensor of dtype and
        shape (made once per dtype and shape)."""
        v = self.views.get((dtype, shape))
        if v is None:
            v = self.views[(dtype, shape)] = self.tensor[:nbytes].view(dtype).view(shape)
        return v


# id of the symmem Group -> its _Workspace (the Group is kept in it, so the
# id is not recycled while the entry lives).
_workspaces: Dict[int, _Workspace] = {}
# (group argument as in _fast, device) -> (group argument, the default
# process group then or None, _Workspace): the lookup of a staged call.
_staging: Dict[Tuple[Any, int], Tuple[Any, Any, _Workspace]] = {}
_staging_lock = threading.Lock()


def staging_bytes() -> int:
    """The first size of a group's staging workspace: SYMMEM_STAGING_BYTES
    (a size: 4096, 512K, 8M), 1 MiB when unset (Note [Staging])."""
    from .errors import env_size

    return env_size("SYMMEM_STAGING_BYTES", _STAGING_DEFAULT)


def _workspace(torch, what: str, tensor, group, dev: int, nbytes: int, need: Optional[int] = None) -> _Workspace:
    """The staging workspace of group on tensor's device holding at least
    need bytes (default nbytes, the call's), made or grown here
    (collective) outside CUDA-graph capture."""
    if need is None:
        need = nbytes
    gkey = _group_key(group)
    e = _staging.get((gkey, dev))
    if e is not None and _entry_current(e, group, torch):
        if need <= e[2].nbytes:
            return e[2]
    g = group_for(group, _symmem_device(tensor.device))
    with _staging_lock:
        ws = _workspaces.get(id(g))
        if ws is not None and ws.group is not g:
            ws = None
        if ws is None or need > ws.nbytes:
            have = 0 if ws is None else ws.nbytes
            first = staging_bytes()
            size = max(first, have, 1 << max(0, (need - 1).bit_length()))
            if tensor.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"symmem.torch.{what}: the tensor ({nbytes} bytes) is not libsymmem memory, so the call "
                    f"goes through the group's staging workspace, which "
                    + ("does not exist yet" if ws is None else f"holds {have} bytes")
                    + f"; making it {size} bytes is a rendezvous, which cannot run inside CUDA-graph capture. "
                    f"Run the call once before capturing, or set SYMMEM_STAGING_BYTES to at least {nbytes} "
                    f"(on every rank), or pass a tensor from symmem.torch.empty")
            t = empty(size, dtype=torch.uint8, device=tensor.device)
            th = rendezvous(t, g)
            outgrown = [] if ws is None else ws.outgrown + [ws.tensor, ws.handle]
            ws = _workspaces[id(g)] = _Workspace(g, t, th, outgrown)
        pg = _world_pg(torch.distributed) if group is None else None
        _staging[(gkey, dev)] = (group, pg, ws)
        return ws


def _staged_code(torch, tensor, what: str) -> int:
    code = (_fast_codes or _codes(torch)).get(tensor.dtype)
    if code is None:
        code = _coll.dtype_code(tensor.dtype, what)  # raises, naming the known dtypes
    return code


def _run_staged(torch, what: str, coll: int, tensor, group, op: str, out, algo, dev: int,
                cpp_group: Optional[str] = None) -> None:
    """_run through the group's staging workspace (Note [Staging])."""
    code = _staged_code(torch, tensor, what)
    opc = _OPS.get(op)
    if opc is None:
        opc = _coll.op_code(op, what)
    algoc = 0 if algo is None else _coll.algo_code(algo, what)
    n = tensor.numel()
    nbytes = n * tensor.element_size()
    ws = _workspace(torch, what, tensor, group, dev, nbytes, need=1)
    stream = (_raw_stream or _raw_stream_fn(torch))(dev) if dev >= 0 else 0
    if cpp_group is not None and _cpp_workspaces.get((cpp_group, dev)) is not ws:
        _cpp_workspace(cpp_group, dev, ws)
    if _reads_in_place(ws, coll, tensor, out, n, nbytes, algoc):
        global _collective_from_fn
        fn = _collective_from_fn
        if fn is None:
            fn = _collective_from_fn = _lib.calls().collective_from
        rc = fn(ws.hptr, coll, code, opc, n, tensor.data_ptr(), None if out is None else out.data_ptr(), algoc, 0,
                stream)
        if rc:
            _lib.check(rc, f"symmem.torch.{what}")
        if group is None and algo is None:
            _remember_in_place(torch, (dev, tensor.data_ptr(), nbytes, coll), ws)
        if cpp_group is not None and algo is None:
            _cpp_remember(cpp_group, tensor, coll, ws.hptr, _CPP_READ_IN_PLACE, ws.world)
        return
    if nbytes > ws.nbytes:
        ws = _workspace(torch, what, tensor, group, dev, nbytes)
        if cpp_group is not None:
            _cpp_workspace(cpp_group, dev, ws)
    stage = ws.view(tensor.dtype, tensor.shape, nbytes)
    stage.copy_(tensor)
    fn = _collective_fn or _lib.calls().collective
    if coll == _coll.ALL_REDUCE:
        dst = tensor if out is None else out
        direct = (dst.is_contiguous() and nbytes <= _STAGED_DIRECT_MAX
                  and algoc not in (_coll.ALGOS["two_shot"], _coll.ALGOS["hierarchical"]))
        rc = fn(ws.hptr, coll, code, opc, n, dst.data_ptr() if direct else None, algoc, 0, stream)
        if rc:
            _lib.check(rc, f"symmem.torch.{what}")
        if not direct:
            dst.copy_(stage)
    else:
        rc = fn(ws.hptr, coll, code, opc, n, out.data_ptr(), algoc, 0, stream)
        if rc:
            _lib.check(rc, f"symmem.torch.{what}")
    if cpp_group is not None and algo is None and tensor.is_contiguous():
        _cpp_remember(cpp_group, tensor, coll, ws.hptr, _CPP_STAGED, ws.world, ws.tensor)


_collective_from_fn = None
_LOW_LATENCY = _coll.ALGOS["low_latency"]
# (device, address, bytes, collective) of a tensor of torch's memory that a
# call on the default group read in place -> (its workspace, the default
# process group then): _run's lookup, which skips the checks that placed
# it. An address outside libsymmem's
# heap never becomes libsymmem memory, and the rest of what decided it
# (the byte count, the collective) is the key; contiguity and out are
# checked again at every call. Bounded: cleared when it grows past
# _IN_PLACE_MAX entries; destroy_group drops its group's.
_in_place: Dict[Tuple[int, int, int, int], Tuple["_Workspace", Any]] = {}
_IN_PLACE_MAX = 4096


def _remember_in_place(torch, key, ws: "_Workspace") -> None:
    if len(_in_place) >= _IN_PLACE_MAX:
        _in_place.clear()
    _in_place[key] = (ws, _world_pg(torch.distributed))


def _reads_in_place(ws: _Workspace, coll: int, tensor, out, n: int, nbytes: int, algoc: int) -> bool:
    """Whether a staged call can skip the copy: the low-latency path reads
    the caller's tensor where it lies (Note [Inputs outside the block] in
    core/symm/coll), for what fits its buffers, contiguous and 16-byte
    aligned, with auto or low_latency, in a group of two or more (a group
    of one stages: its copy is the whole call anyway); the library checks
    the same again and refuses, naming why, if this guessed wrong."""
    if (algoc not in (0, _LOW_LATENCY) or not ws.ll_bytes or ws.world < 2 or not tensor.is_contiguous()
            or tensor.data_ptr() % 16):
        return False
    per = nbytes
    if coll == _coll.REDUCE_SCATTER:
        if n % ws.world:
            return False
        per = nbytes // ws.world
    if per > ws.ll_bytes or (coll != _coll.ALL_REDUCE and per % 8):
        return False
    return out is None or (out.is_contiguous() and out.data_ptr() % 16 == 0)


_OPS = dict(_coll.OPS)


def _group_name(group) -> str:
    """The name the operators carry for group ("" for the default group)."""
    if group is None:
        return ""
    if isinstance(group, str):
        return group
    return getattr(group, "group_name", "")


def _group_arg(name: str):
    return None if name == "" else name


_is_compiling = None


def _compiling(torch) -> bool:
    """torch.compiler.is_compiling(), the function kept (Dynamo knows it by
    identity, so tracing still reads True here)."""
    global _is_compiling
    fn = _is_compiling
    if fn is None:
        compiler = getattr(torch, "compiler", None)
        fn = _is_compiling = compiler.is_compiling if compiler is not None else (lambda: False)
    return fn()


def _sm_free_compiled(torch, what: str, sm_free) -> None:
    """Refuses sm_free under torch.compile for the operators whose schema
    carries no algorithm (all_gather, reduce_scatter, all_to_all)."""
    if _coll.sm_free_algo(None, sm_free, what) is not None and _compiling(torch):
        raise NotImplementedError(
            f"symmem.torch.{what}(sm_free=True) under torch.compile: the compiled operator takes no algorithm; "
            f"set SYMMEM_LEAVE_SMS=1 (on every rank) to run every collective on the copy engines")


def all_reduce(tensor, op: str = "sum", group=None, out=None, algo: Optional[str] = None, *, inplace: bool = True,
               sm_free: bool = False):
    """Reduce tensor over every rank of group, on the current stream; in
    place unless out is given, or inplace=False (the functional form, as
    torch's one_shot_all_reduce: a new tensor holds the result, tensor is
    untouched). Returns the result tensor. A tensor from :func:`empty`
    is reduced where it lies (the first call on it rendezvouses,
    collective); any other tensor of the device goes through the group's
    staging workspace (Note [Staging]).
    algo: None/"auto", "one_shot", "two_shot" (torch.ops.symm_mem's
    one_shot_all_reduce / two_shot_all_reduce_), "low_latency". On an NCCL
    process group that spans machines: "hierarchical" (reduce-scatter in
    each machine with libsymmem's kernels, NCCL across machines, all-gather
    in each machine) or "nccl" (the whole collective on the communicator),
    auto choosing by size and topology, on the current stream; all_gather
    and reduce_scatter run whole on the communicator (docs/machines.md).
    "copy_engine" (or sm_free=True): the peers' inputs pulled by the copy
    engines and reduced by a small kernel, leaving the SMs to the model
    (docs/speed.md, "Collectives on the copy engines").
    Under torch.compile it is the functional operator
    torch.ops.symmem.all_reduce (the in-place form copies its result back,
    which Inductor folds away for an intermediate), or all_reduce_out."""
    torch = _torch_module or _torch()
    if sm_free is not False:
        algo = _coll.sm_free_algo(algo, sm_free, "all_reduce")
    if _compiling(torch):
        if out is None:
            result = torch.ops.symmem.all_reduce(tensor, op, _group_name(group), algo or "auto")
            if not inplace:
                return result
            tensor.copy_(result)
            return tensor
        torch.ops.symmem.all_reduce_out(tensor, out, op, _group_name(group), algo or "auto")
        return out
    if out is None and not inplace:
        out = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    _run("all_reduce", _coll.ALL_REDUCE, tensor, group, op, out, algo)
    return tensor if out is None else out


def _world_of(torch, what: str, tensor, group) -> int:
    """group's world size: from the tensor's rendezvous where it is
    libsymmem memory (made here when it is not yet), else from the staging
    workspace that the call will use (Note [Staging])."""
    if not tensor.numel():
        return group_for(group, _symmem_device(tensor.device)).world_size
    if group is None:  # the zero-copy path's entry, as _run finds it
        e = _fast.get((None, tensor.get_device(), tensor.data_ptr(), tensor.nbytes))
        if e is not None and e[1] is _world_pg(torch.distributed):
            return e[3]
    if tensor.is_contiguous() and _is_symmem(tensor):
        return _fast_entry(torch, tensor, group)[3]
    return _workspace(torch, what, tensor, group, tensor.get_device(), tensor.numel() * tensor.element_size()).world


def _gather_shape(tensor, w: int):
    return (w * tensor.shape[0],) + tuple(tensor.shape[1:]) if tensor.dim() else (w,)


def _scatter_shape(tensor, w: int):
    if tensor.dim() and tensor.shape[0] % w == 0:
        return (tensor.shape[0] // w,) + tuple(tensor.shape[1:])
    return (tensor.numel() // w,)


def all_gather(tensor, group=None, out=None, *, sm_free: bool = False):
    """Gather every rank's tensor into out (default: a new tensor of
    world_size * tensor.shape[0] rows), rank order, like
    torch.distributed.all_gather_into_tensor. Returns out. tensor is any
    tensor of the device (one of :func:`empty` is read where it lies; any
    other is staged, Note [Staging]). sm_free=True: one copy per peer on
    the copy engines, no kernel (algo "copy_engine"), for an all-gather
    beside a matmul on another stream. Under torch.compile it is
    torch.ops.symmem.all_gather (or all_gather_out)."""
    torch = _torch_module or _torch()
    if sm_free is not False:
        _sm_free_compiled(torch, "all_gather", sm_free)
    if _compiling(torch):
        if out is None:
            return torch.ops.symmem.all_gather(tensor, _group_name(group))
        torch.ops.symmem.all_gather_out(tensor, out, _group_name(group))
        return out
    return _all_gather(torch, tensor, group, out, "copy_engine" if sm_free else None)


def _all_gather(torch, tensor, group, out, algo, cpp_group: Optional[str] = None):
    """all_gather's eager call (also the operators' Python kernels)."""
    if out is None:
        w = _world_of(torch, "all_gather", tensor, group)
        out = torch.empty(_gather_shape(tensor, w), dtype=tensor.dtype, device=tensor.device)
    _run("all_gather", _coll.ALL_GATHER, tensor, group, "sum", out, algo, cpp_group)
    return out


def reduce_scatter(tensor, op: str = "sum", group=None, out=None, *, sm_free: bool = False):
    """Reduce tensor over every rank and keep this rank's slice (numel /
    world_size elements; rows [rank * n / w, (rank + 1) * n / w) when
    shape[0] divides), like torch.distributed.reduce_scatter_tensor.
    Returns out (default: a new tensor). tensor is any tensor of the
    device (staged unless it is one of :func:`empty`, Note [Staging]).
    sm_free=True: the peers' slices pulled by the copy engines, then a
    small reduction kernel (algo "copy_engine").
    Under torch.compile it is torch.ops.symmem.reduce_scatter (or
    reduce_scatter_out)."""
    torch = _torch_module or _torch()
    if sm_free is not False:
        _sm_free_compiled(torch, "reduce_scatter", sm_free)
    if _compiling(torch):
        if out is None:
            return torch.ops.symmem.reduce_scatter(tensor, op, _group_name(group))
        torch.ops.symmem.reduce_scatter_out(tensor, out, op, _group_name(group))
        return out
    return _reduce_scatter(torch, tensor, op, group, out, "copy_engine" if sm_free else None)


def _reduce_scatter(torch, tensor, op: str, group, out, algo, cpp_group: Optional[str] = None):
    """reduce_scatter's eager call (also the operators' Python kernels)."""
    w = _world_of(torch, "reduce_scatter", tensor, group)
    if tensor.numel() % w:
        raise ValueError(f"symmem.torch.reduce_scatter: {tensor.numel()} elements do not split over {w} ranks")
    if out is None:
        out = torch.empty(_scatter_shape(tensor, w), dtype=tensor.dtype, device=tensor.device)
    _run("reduce_scatter", _coll.REDUCE_SCATTER, tensor, group, op, out, algo, cpp_group)
    return out


# --------------------------------------------------------------------------
# All-to-all on tensors (the arguments and results of torch 2.11's
# torch.ops.symm_mem.all_to_all_vdev, all_to_all_vdev_2d and
# all_to_all_vdev_2d_offset; include/symmem.h, "All-to-all")
# --------------------------------------------------------------------------

# The dtype that moves a chunk of another dtype's bytes: all-to-all only
# copies, so any element type goes as int32 or bfloat16 words of the same
# bytes.
_A2A_WORDS = ((4, "int32"), (2, "bfloat16"))
_a2a_fns: Dict[str, Any] = {}


def _a2a_fn(name: str):
    fn = _a2a_fns.get(name)
    if fn is None:
        fn = _a2a_fns[name] = getattr(_lib.lib(), name)
    return fn


def _a2a_entry(torch, what: str, input, group):
    """(the _fast entry of input's rendezvous, the device index): input is
    the symmetric side of every all-to-all (Note [Eager collectives])."""
    if not input.is_contiguous():
        raise ValueError(f"symmem.torch.{what}: input must be contiguous")
    dev = input.get_device()
    e = None
    if group is None:
        e = _fast.get((None, dev, input.data_ptr(), input.nbytes))
        if e is not None and e[1] is not _world_pg(torch.distributed):
            e = None
    if e is None:
        if input.numel() and not _is_symmem(input):
            # Note [Staging]: the input goes to the workspace, where the
            # call runs; out and the splits are the caller's as always.
            nbytes = input.numel() * input.element_size()
            ws = _workspace(torch, what, input, group, dev, nbytes)
            ws.view(input.dtype, input.shape, nbytes).copy_(input)
            return (group, None, ws.hptr, ws.world, None), dev
        e = _fast_entry(torch, input, group, dev)
    return e, dev


def _a2a_check(what: str, input, out, tensors) -> None:
    """What can be checked without reading device memory: out beside input
    (rows of the same bytes), and each (name, tensor, shape) of tensors an
    int64, contiguous tensor of that shape on input's device."""
    if input.dim() < 1 or out.dim() < 1:
        raise ValueError(f"symmem.torch.{what}: input and out need a dimension 0 (rows), got shapes "
                         f"{tuple(input.shape)} and {tuple(out.shape)}")
    if out.dtype != input.dtype:
        raise ValueError(f"symmem.torch.{what}: out is {out.dtype}, input {input.dtype}: they must be the same dtype")
    if out.stride(0) != input.stride(0):
        raise ValueError(f"symmem.torch.{what}: out's rows (stride(0) {out.stride(0)}) differ from input's "
                         f"(stride(0) {input.stride(0)}): rows must have the same size")
    if not out.is_contiguous():
        raise ValueError(f"symmem.torch.{what}: out must be contiguous")
    if out.device != input.device:
        raise ValueError(f"symmem.torch.{what}: out is on {out.device}, input on {input.device}")
    torch = _torch_module
    for name, t, shape in tensors:
        if t.dtype != torch.int64:
            raise ValueError(f"symmem.torch.{what}: {name} must be int64, not {t.dtype}")
        if tuple(t.shape) != shape:
            raise ValueError(f"symmem.torch.{what}: {name} has shape {tuple(t.shape)}, expected {shape}")
        if not t.is_contiguous():
            raise ValueError(f"symmem.torch.{what}: {name} must be contiguous")
        if t.device != input.device:
            raise ValueError(f"symmem.torch.{what}: {name} is on {t.device}, input on {input.device}")


def _experts(what: str, name: str, nsplits: int, world: int) -> int:
    if nsplits < 1 or nsplits % world:
        raise ValueError(f"symmem.torch.{what}: {name} holds {nsplits} splits, not a positive multiple of the "
                         f"world size {world} (world_size * experts per rank)")
    return nsplits // world


def _a2a_stream(torch, dev: int) -> int:
    return (_raw_stream or _raw_stream_fn(torch))(dev) if dev >= 0 else 0


def _run_all_to_all(input, out, group, sm_free: bool = False, cpp_group: Optional[str] = None) -> None:
    torch = _torch_module or _torch()
    what = "all_to_all"
    e, dev = _a2a_entry(torch, what, input, group)
    w = e[3]
    if out.dtype != input.dtype or out.numel() != input.numel() or not out.is_contiguous() or out.device != input.device:
        raise ValueError(f"symmem.torch.all_to_all: out must be a contiguous {input.dtype} tensor of "
                         f"{input.numel()} elements on {input.device}, like input; got {out.dtype}, "
                         f"{out.numel()} elements, on {out.device}")
    if input.numel() % w:
        raise ValueError(f"symmem.torch.all_to_all: {input.numel()} elements do not split over {w} ranks")
    count = input.numel() // w
    code = (_fast_codes or _codes(torch)).get(input.dtype)
    if code is None:
        chunk = count * input.element_size()
        for size, name in _A2A_WORDS:
            if chunk % size == 0:
                code, count = _coll.DTYPES[name], chunk // size
                break
        else:
            raise ValueError(f"symmem.torch.all_to_all: a chunk of {chunk} bytes ({input.dtype}) is not a whole "
                             f"number of 2-byte words")
    if sm_free:
        rc = (_collective_fn or _lib.calls().collective)(
            e[2], _coll.ALL_TO_ALL, code, 0, count, out.data_ptr(), _coll.ALGOS["copy_engine"], 0, _a2a_stream(torch, dev))
    else:
        rc = _lib.calls().all_to_all(e[2], code, count, out.data_ptr(), _a2a_stream(torch, dev))
    if rc:
        _lib.check(rc, "symmem.torch.all_to_all")
    if cpp_group is not None and e[4] is not None and not sm_free:  # not staged: the input's own handle
        _cpp_remember(cpp_group, input, _coll.ALL_TO_ALL, e[2], _CPP_ZERO_COPY, w)


def _run_all_to_all_v(input, out, in_splits, out_splits_offsets, group, cpp_group: Optional[str] = None) -> None:
    torch = _torch_module or _torch()
    what = "all_to_all_v"
    e, dev = _a2a_entry(torch, what, input, group)
    w = e[3]
    _a2a_check(what, input, out, (("in_splits", in_splits, (w,)), ("out_splits_offsets", out_splits_offsets, (2, w))))
    rc = _a2a_fn("symmem_all_to_all_v")(
        e[2], input.stride(0) * input.element_size(), in_splits.data_ptr(), out.data_ptr(), out.shape[0],
        out_splits_offsets.data_ptr(), _a2a_stream(torch, dev))
    if rc:
        _lib.check(rc, f"symmem.torch.{what}")
    if cpp_group is not None and e[4] is not None:  # not staged: the input's own handle
        _cpp_remember(cpp_group, input, _CPP_A2A_V, e[2], _CPP_ZERO_COPY, w)


def _run_all_to_all_v_2d(input, out, in_splits, out_splits_offsets, group, major_align: int,
                         cpp_group: Optional[str] = None) -> None:
    torch = _torch_module or _torch()
    what = "all_to_all_v_2d"
    e, dev = _a2a_entry(torch, what, input, group)
    w = e[3]
    if in_splits.dim() != 1:
        raise ValueError(f"symmem.torch.{what}: in_splits must be 1-D (world_size * experts), "
                         f"got shape {tuple(in_splits.shape)}")
    experts = _experts(what, "in_splits", in_splits.shape[0], w)
    s = w * experts
    _a2a_check(what, input, out, (("in_splits", in_splits, (s,)), ("out_splits_offsets", out_splits_offsets, (2, s))))
    if major_align < 1:
        raise ValueError(f"symmem.torch.{what}: major_align must be at least 1, got {major_align}")
    rc = _a2a_fn("symmem_all_to_all_v_2d")(
        e[2], input.stride(0) * input.element_size(), experts, in_splits.data_ptr(), out.data_ptr(), out.shape[0],
        out_splits_offsets.data_ptr(), major_align, _a2a_stream(torch, dev))
    if rc:
        _lib.check(rc, f"symmem.torch.{what}")
    if cpp_group is not None and e[4] is not None:  # not staged: the input's own handle
        _cpp_remember(cpp_group, input, _CPP_A2A_V_2D, e[2], _CPP_ZERO_COPY, w)


def _run_all_to_all_v_2d_offset(input, out, in_splits_offsets, out_splits_offsets, group,
                                cpp_group: Optional[str] = None) -> None:
    torch = _torch_module or _torch()
    what = "all_to_all_v_2d_offset"
    e, dev = _a2a_entry(torch, what, input, group)
    w = e[3]
    if in_splits_offsets.dim() != 2 or in_splits_offsets.shape[0] != 2:
        raise ValueError(f"symmem.torch.{what}: in_splits_offsets must have shape (2, world_size * experts), "
                         f"got {tuple(in_splits_offsets.shape)}")
    experts = _experts(what, "in_splits_offsets", in_splits_offsets.shape[1], w)
    s = w * experts
    _a2a_check(what, input, out, (("in_splits_offsets", in_splits_offsets, (2, s)),
                                  ("out_splits_offsets", out_splits_offsets, (2, s))))
    rc = _a2a_fn("symmem_all_to_all_v_2d_offset")(
        e[2], input.stride(0) * input.element_size(), experts, in_splits_offsets.data_ptr(), out.data_ptr(),
        out.shape[0], out_splits_offsets.data_ptr(), _a2a_stream(torch, dev))
    if rc:
        _lib.check(rc, f"symmem.torch.{what}")
    if cpp_group is not None and e[4] is not None:  # not staged: the input's own handle
        _cpp_remember(cpp_group, input, _CPP_A2A_V_2D_OFFSET, e[2], _CPP_ZERO_COPY, w)


def all_to_all(input, out=None, group=None, *, sm_free: bool = False):
    """Equal splits: chunk p of input (numel / world_size elements, rank
    order) goes to rank p, and out (default: a new tensor shaped like
    input) receives rank p's chunk for us as its chunk p. input is any
    contiguous tensor of the device: one of :func:`empty` is read where it
    lies (the first call on it rendezvouses, collective), any other is
    staged (Note [Staging]). Any dtype (the bytes are moved). Returns out.
    sm_free=True: one copy per peer on the copy engines, no kernel. Under
    torch.compile it is torch.ops.symmem.all_to_all (or all_to_all_out)."""
    torch = _torch()
    _sm_free_compiled(torch, "all_to_all", sm_free)
    if _compiling(torch):
        if out is None:
            return torch.ops.symmem.all_to_all(input, _group_name(group))
        torch.ops.symmem.all_to_all_out(input, out, _group_name(group))
        return out
    if out is None:
        out = torch.empty(input.shape, dtype=input.dtype, device=input.device)
    _run_all_to_all(input, out, group, sm_free)
    return out


def all_to_all_v(input, out, in_splits, out_splits_offsets, group=None) -> None:
    """torch.ops.symm_mem.all_to_all_vdev on libsymmem: rows are input's
    dimension 0. in_splits (int64, world_size) says how many rows go to
    each rank, taken from input in rank order; out receives rank s's rows at
    row out_splits_offsets[1][s], out_splits_offsets[0][s] of them (int64,
    (2, world_size), written on the device). The split sizes are read on
    the device when the kernel runs: no host synchronisation, capturable in
    CUDA graphs. input is any contiguous tensor of the device (one of
    :func:`empty` is read where it lies, the first call on it
    rendezvousing; any other is staged, Note [Staging]); out and the splits
    are any tensors of its device. Rows
    that would pass out's shape[0] are refused on the device (out untouched,
    handle.device_error() names the rank). Under torch.compile it is
    torch.ops.symmem.all_to_all_v."""
    torch = _torch()
    if _compiling(torch):
        torch.ops.symmem.all_to_all_v(input, out, in_splits, out_splits_offsets, _group_name(group))
        return None
    _run_all_to_all_v(input, out, in_splits, out_splits_offsets, group)
    return None


def all_to_all_v_2d(input, out, in_splits, out_splits_offsets, group=None, major_align: Optional[int] = None) -> None:
    """torch.ops.symm_mem.all_to_all_vdev_2d on libsymmem, the MoE dispatch:
    in_splits (int64, world_size * experts) holds in_splits[p * experts + e]
    rows for local expert e of rank p, taken from input in that order; out
    groups what arrives by our expert, index i = e * world_size + s (expert
    e, source rank s): out_splits_offsets[0][i] rows at row
    out_splits_offsets[1][i]. Each expert's rows start at a multiple of
    major_align (None: 1), and an expert that receives nothing still takes
    major_align rows (for grouped GEMMs that refuse empty groups). Under
    torch.compile it is torch.ops.symmem.all_to_all_v_2d."""
    torch = _torch()
    align = 1 if major_align is None else int(major_align)
    if _compiling(torch):
        torch.ops.symmem.all_to_all_v_2d(input, out, in_splits, out_splits_offsets, _group_name(group), align)
        return None
    _run_all_to_all_v_2d(input, out, in_splits, out_splits_offsets, group, align)
    return None


def all_to_all_v_2d_offset(input, out, in_splits_offsets, out_splits_offsets, group=None) -> None:
    """torch.ops.symm_mem.all_to_all_vdev_2d_offset on libsymmem, the MoE
    combine (the dispatch's reverse): in_splits_offsets (int64, (2,
    world_size * experts), index i = e * world_size + p) holds the rows our
    expert e sends back to rank p (row 0) and their row offsets in input
    (row 1: the dispatch's out_splits_offsets; padding between the groups
    is not sent); out receives in rank-major order i = p * experts + e the
    rows rank p's expert e sends back, packed, described in
    out_splits_offsets. Under torch.compile it is
    torch.ops.symmem.all_to_all_v_2d_offset."""
    torch = _torch()
    if _compiling(torch):
        torch.ops.symmem.all_to_all_v_2d_offset(input, out, in_splits_offsets, out_splits_offsets, _group_name(group))
        return None
    _run_all_to_all_v_2d_offset(input, out, in_splits_offsets, out_splits_offsets, group)
    return None


# --------------------------------------------------------------------------
# Tensor parallelism (docs/tensor-parallel.md): the all-reduce with RMSNorm
# that ends a decode layer, and torch 2.11's fused_all_gather_matmul /
# fused_matmul_reduce_scatter with torch's matmuls and libsymmem's
# communication
# --------------------------------------------------------------------------

# Note [Tensor-parallel workspace]
#
# The fused matmul operators take ordinary tensors. Each (symmem Group,
# device) has one symmetric workspace: a uint8 tensor of libsymmem memory,
# rendezvoused, grown when a call needs more (collective: every rank's call
# needs the same bytes, as the shapes agree) and never during CUDA-graph
# capture. A call:
#   1. meets the peers at a barrier on signal channel 0 of the workspace's
#      handle, on the current stream: every peer's stream has passed its
#      previous call, so nobody still reads what is about to be written;
#   2. on a side stream, copies what each peer p needs into p's workspace
#      (over NVLink) and puts a signal to p on channel 1 (_TP_DATA_CHANNEL);
#   3. on the current stream runs the matmuls: the first that needs peer
#      p's data waits for p's signal (wait_signal on the stream), so a
#      chunk's matmul starts as soon as it has arrived while the next one
#      crosses;
#   4. joins the side stream into the current one.
# Under CUDA-graph capture the signals cannot serve: a stream signal is a
# store of the next count and a wait a poll for the count expected, both
# numbers fixed when the call is enqueued, so a graph replays the same
# counts (Note [Signals as a kernel] in core/symm) and its second replay
# would wait for nothing. A captured call therefore meets the peers through
# a collective instead, whose call counter lives in device memory and goes
# on counting across replays: an all-reduce of 16 bytes (the low-latency
# path: one crossing) on a second handle of the same workspace, its last
# 256 bytes (_TP_SYNC_BYTES). It stands for the barrier of step 1, and for
# the signals: after the pushes, the current stream joins the side stream
# and meets the peers again, after which every chunk has arrived (the
# all-gather's own chunk still overlaps the pushes; the reduce-scatter
# loses nothing, as it reduces once every chunk is there).
# On the host backend there are no streams: the puts are atomic adds and
# the waits block the calling thread, in the same order, so the results
# are the same. all_reduce_rmsnorm stages an x that is not libsymmem memory
# in the same workspace.

_TP_DATA_CHANNEL = 1
_TP_SYNC_BYTES = 256
# (id of the symmem Group, symmem device) -> (workspace tensor, its handle,
# the handle of its last _TP_SYNC_BYTES)
_tp_workspaces: Dict[Tuple[int, int], Tuple[Any, TorchHandle, TorchHandle]] = {}
# device index -> the fused operators' side stream
_tp_side_streams: Dict[int, Any] = {}


def _tp_workspace(torch, g: Group, device, nbytes: int) -> Tuple[TorchHandle, TorchHandle]:
    """The workspace of (g, device) with at least nbytes, and the handle of
    its synchronising all-reduce (Note [Tensor-parallel workspace])."""
    key = (id(g), _symmem_device(device))
    e = _tp_workspaces.get(key)
    if e is not None and e[0].numel() - _TP_SYNC_BYTES >= nbytes:
        return e[1], e[2]
    have = 0 if e is None else e[0].numel() - _TP_SYNC_BYTES
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"symmem.torch: the tensor-parallel workspace of group {getattr(g, 'name', '')!r} holds {have} bytes "
            f"and this call needs {nbytes}: it cannot grow during CUDA-graph capture (run the call once before "
            f"capturing)")
    size = max(nbytes, 2 * have, 1 << 20)
    size = (size + (1 << 20) - 1) >> 20 << 20
    if e is not None:
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # the old workspace's last readers are done
        e[2].release()
        e[1].release()
    t = empty(size + _TP_SYNC_BYTES, dtype=torch.uint8, device=device)
    h = rendezvous(t, g)
    hs = rendezvous(t[size:], g)
    # Its first all-reduce here, outside any capture: whatever a handle's
    # first collective sets up is done before a graph could record it.
    hs.handle.all_reduce("int32", "sum", 4, None, torch.cuda.current_stream(device).cuda_stream
                         if device.type == "cuda" else 0)
    _tp_workspaces[key] = (t, h, hs)
    return h, hs


def _tp_meet(hs: TorchHandle, lanes) -> None:
    """A captured call's meeting with the peers (Note [Tensor-parallel
    workspace]): a 16-byte all-reduce on the current stream, which
    completes once every peer's stream has reached it."""
    hs.handle.all_reduce("int32", "sum", 4, None, lanes.raw())


class _Lanes:
    """The current stream and the side stream of a fused operator (no
    streams on the CPU: everything runs in order on the calling thread)."""

    def __init__(self, torch, device):
        self.torch = torch
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.main = torch.cuda.current_stream(device)
            side = _tp_side_streams.get(device.index)
            if side is None:
                side = _tp_side_streams[device.index] = torch.cuda.Stream(device)
            self.side = side

    def raw(self, side: bool = False) -> int:
        if not self.cuda:
            return 0
        return (self.side if side else self.main).cuda_stream

    def fork(self) -> None:
        """The side stream waits for what the current stream has enqueued."""
        if self.cuda:
            self.side.wait_stream(self.main)

    def join(self) -> None:
        if self.cuda:
            self.main.wait_stream(self.side)

    def on_side(self):
        return self.torch.cuda.stream(self.side) if self.cuda else contextlib.nullcontext()

    def capturing(self) -> bool:
        return self.cuda and self.torch.cuda.is_current_stream_capturing()


def _tp_check(what: str, tensors) -> None:
    """Every (name, tensor) of tensors has the first one's dtype and device."""
    name0, t0 = tensors[0]
    for name, t in tensors[1:]:
        if t.dtype != t0.dtype:
            raise ValueError(f"{what}: {name} is {t.dtype}, {name0} {t0.dtype}: they must be the same dtype")
        if t.device != t0.device:
            raise ValueError(f"{what}: {name} is on {t.device}, {name0} on {t0.device}")
    if t0.device.type not in ("cuda", "cpu"):
        raise ValueError(f"{what}: unsupported device {t0.device}")


def _tp_group(torch, group, device):
    g = group_for(group, _symmem_device(device))
    return g, g.world_size, g.rank


def _rows(t, dim: int):
    """t as a matrix whose rows run along dim first (the layout of the
    fused operators' chunks): dim moved to the front unless it is the last."""
    if dim != t.dim() - 1:
        t = t.movedim(dim, 0)
    return t.reshape(-1, t.shape[-1])


def _ag_mm(torch, a_shard, bs, gather_dim: int, group, return_a: bool):
    """fused_all_gather_matmul's work (Note [Tensor-parallel workspace]):
    (the gathered A or None, [A @ B for B in bs])."""
    from . import _tp

    g, W, me = _tp_group(torch, group, a_shard.device)
    _tp.all_gather_matmul_shapes(tuple(a_shard.shape), [tuple(b.shape) for b in bs], gather_dim, W)
    _tp_check(_tp.AG, [("a_shard", a_shard)] + [(f"bs[{i}]", b) for i, b in enumerate(bs)])
    last = gather_dim == a_shard.dim() - 1
    moved = a_shard if last else a_shard.movedim(gather_dim, 0)
    lead = list(moved.shape[:-1])
    a_flat = moved.reshape(-1, moved.shape[-1]).contiguous()
    m, k = a_flat.shape
    h, hs = _tp_workspace(torch, g, a_shard.device, W * a_flat.numel() * a_flat.element_size())
    lanes = _Lanes(torch, a_shard.device)
    captured = lanes.capturing()
    ws = h.get_buffer(me, (W, m, k), a_flat.dtype)
    if captured:
        _tp_meet(hs, lanes)
    else:
        h.handle.barrier(0, None, lanes.raw())
    lanes.fork()
    with lanes.on_side():
        for step in range(1, W):
            p = (me + step) % W
            h.get_buffer(p, (W, m, k), a_flat.dtype)[me].copy_(a_flat)
            if not captured:
                h.handle.put_signal(p, _TP_DATA_CHANNEL, lanes.raw(side=True))
    a_all = a_flat.new_empty(W, m, k) if return_a else None
    if last:
        b_parts = [b.chunk(W) for b in bs]  # rows r*k .. (r+1)*k meet rank r's columns
        outs = [torch.mm(a_flat, parts[me]) for parts in b_parts]
    else:
        outs = [a_flat.new_empty(W, m, b.shape[1]) for b in bs]
        for o, b in zip(outs, bs):
            torch.mm(a_flat, b, out=o[me])
    if a_all is not None:
        a_all[me].copy_(a_flat)
    if captured and W > 1:
        lanes.join()
        _tp_meet(hs, lanes)  # every rank's pushes have landed
    for step in range(1, W):
        p = (me - step) % W
        if not captured:
            h.handle.wait_signal(p, _TP_DATA_CHANNEL, None, lanes.raw())
        chunk = ws[p]
        for i, b in enumerate(bs):
            if last:
                outs[i].addmm_(chunk, b_parts[i][p])
            else:
                torch.mm(chunk, b, out=outs[i][p])
        if a_all is not None:
            a_all[p].copy_(chunk)
    lanes.join()
    if last:
        a = torch.cat(list(a_all.unbind(0)), dim=-1).view(*lead, W * k) if return_a else None
        return a, [o.view(*lead, o.shape[-1]) for o in outs]

    def unflatten(t):
        return t.view(W, *lead, t.shape[-1]).flatten(0, 1).movedim(0, gather_dim)

    return (unflatten(a_all) if return_a else None), [unflatten(o) for o in outs]


def _pipelined_reduce_scatter(torch, g, W: int, me: int, device, dtype, chunk_shape, produce, reduce_op: str):
    """The reduction over the ranks, in rank order in fp32 and rounded once
    to dtype, of chunk me of every rank, where produce(q, out) writes this
    rank's chunk q (of chunk_shape) into out: each chunk for a peer is
    produced on the current stream and pushed into the peer's workspace by
    the side stream while the next one is produced (Note [Tensor-parallel
    workspace])."""
    full = (W,) + tuple(chunk_shape)
    h, hs = _tp_workspace(torch, g, device, math.prod(full) * _itemsize(torch, dtype))
    lanes = _Lanes(torch, device)
    captured = lanes.capturing()
    ws = h.get_buffer(me, full, dtype)
    if captured:
        _tp_meet(hs, lanes)
    else:
        h.handle.barrier(0, None, lanes.raw())
    stage = torch.empty(full, dtype=dtype, device=device) if W > 1 else None
    for step in range(1, W):
        q = (me + step) % W
        produce(q, stage[q])
        lanes.fork()
        with lanes.on_side():
            h.get_buffer(q, full, dtype)[me].copy_(stage[q])
            if not captured:
                h.handle.put_signal(q, _TP_DATA_CHANNEL, lanes.raw(side=True))
    produce(me, ws[me])
    if captured and W > 1:
        lanes.join()
        _tp_meet(hs, lanes)  # every rank's chunks for us have landed
    for step in range(1, W):
        if not captured:
            h.handle.wait_signal((me - step) % W, _TP_DATA_CHANNEL, None, lanes.raw())
    if W == 2 and reduce_op == "sum":
        out = torch.add(ws[0], ws[1])  # one kernel: torch adds 16-bit types in fp32 and rounds once
    else:
        acc = ws[0].to(torch.float32, copy=True)
        for r in range(1, W):
            acc.add_(ws[r])
        if reduce_op == "avg":
            acc.div_(W)
        out = acc.to(dtype)
    lanes.join()
    return out


def _mm_rs(torch, a, b, reduce_op: str, scatter_dim: int, group):
    """fused_matmul_reduce_scatter's work."""
    from . import _tp

    g, W, me = _tp_group(torch, group, a.device)
    _tp.matmul_reduce_scatter_shape(tuple(a.shape), tuple(b.shape), reduce_op, scatter_dim, W)
    _tp_check(_tp.RS, [("a", a), ("b", b)])
    if scatter_dim == a.dim() - 1:
        a_flat = a.reshape(-1, a.shape[-1])
        b_parts = b.chunk(W, dim=1)
        n = b.shape[1] // W

        def produce(q, out):
            torch.mm(a_flat, b_parts[q], out=out)

        out = _pipelined_reduce_scatter(torch, g, W, me, a.device, a.dtype, (a_flat.shape[0], n), produce, reduce_op)
        return out.view(*a.shape[:-1], n)
    moved = a.movedim(scatter_dim, 0)
    lead = list(moved.shape[:-1])
    lead[0] //= W
    x = moved.reshape(-1, moved.shape[-1])
    xs = x.chunk(W)

    def produce(q, out):
        torch.mm(xs[q], b, out=out)

    out = _pipelined_reduce_scatter(torch, g, W, me, a.device, a.dtype, (x.shape[0] // W, b.shape[1]), produce,
                                    reduce_op)
    return out.view(*lead, b.shape[1]).movedim(0, scatter_dim)


def _rs_dim(torch, t, dim: int, group):
    """reduce_scatter(t, "sum") along dim over group, with the fused
    operators' pipeline (the backward of the all-gather of A)."""
    g, W, me = _tp_group(torch, group, t.device)
    moved = t.movedim(dim, 0)
    per = moved.shape[0] // W
    shape = (per,) + tuple(moved.shape[1:])

    def produce(q, out):
        out.copy_(moved[q * per:(q + 1) * per])

    out = _pipelined_reduce_scatter(torch, g, W, me, t.device, t.dtype, shape, produce, "sum")
    return out.movedim(0, dim)


_tp_functions = None


def _tp_autograd(torch):
    """The autograd.Functions of the fused operators: each one's backward
    runs the other (an all-gather's transpose is a reduce-scatter)."""
    global _tp_functions
    if _tp_functions is not None:
        return _tp_functions

    class AllGatherMatmul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, gather_dim, group, a_shard, *bs):
            ctx.set_materialize_grads(False)  # an output the loss does not use has no gradient to move
            a, outs = _ag_mm(torch, a_shard, list(bs), gather_dim, group, True)
            ctx.gather_dim, ctx.group = gather_dim, group
            ctx.save_for_backward(a, *bs)
            return (a, *outs)

        @staticmethod
        def backward(ctx, ga, *gouts):
            a, *bs = ctx.saved_tensors
            d, group = ctx.gather_dim, ctx.group
            grad_a = None
            for go, b in zip(gouts, bs):
                if go is not None:
                    part = _mm_rs(torch, go.contiguous(), b.t(), "sum", d, group)
                    grad_a = part if grad_a is None else grad_a + part
            if ga is not None:
                part = _rs_dim(torch, ga, d, group)
                grad_a = part if grad_a is None else grad_a + part
            grad_bs = []
            for i, (go, b) in enumerate(zip(gouts, bs)):
                if go is None or not ctx.needs_input_grad[3 + i]:
                    grad_bs.append(None)
                else:
                    grad_bs.append(_rows(a, d).t() @ _rows(go, d))
            return (None, None, grad_a, *grad_bs)

    class MatmulReduceScatter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, reduce_op, scatter_dim, group, a, b):
            ctx.set_materialize_grads(False)
            ctx.reduce_op, ctx.scatter_dim, ctx.group = reduce_op, scatter_dim, group
            ctx.save_for_backward(a, b)
            return _mm_rs(torch, a, b, reduce_op, scatter_dim, group)

        @staticmethod
        def backward(ctx, gout):
            if gout is None:
                return None, None, None, None, None
            a, b = ctx.saved_tensors
            d = ctx.scatter_dim
            g_full, (grad_a,) = _ag_mm(torch, gout.contiguous(), [b.t()], d, ctx.group, True)
            if ctx.reduce_op == "avg":
                w = g_full.shape[d] // gout.shape[d]
                g_full, grad_a = g_full / w, grad_a / w
            grad_b = _rows(a, d).t() @ _rows(g_full, d) if ctx.needs_input_grad[4] else None
            return None, None, None, grad_a, grad_b

    _tp_functions = (AllGatherMatmul, MatmulReduceScatter)
    return _tp_functions


def fused_all_gather_matmul(a_shard, bs, gather_dim: int, group=None, return_a: bool = True):
    """torch.ops.symm_mem.fused_all_gather_matmul on libsymmem: A is a_shard
    gathered along gather_dim over group (rank order); returns (A, or None
    with return_a=False, [A @ B for B in bs]). With gather_dim the last
    dimension, the gathered dimension is the one contracted (B has
    world_size * a_shard.shape[-1] rows). The matmuls are torch's; the
    gather is libsymmem's, chunked by rank and overlapped: the matmul of a
    peer's chunk waits on the stream for the peer's signal while the next
    chunk crosses (Note [Tensor-parallel workspace]). Inputs are any
    tensors (staged in the group's symmetric workspace). Differentiable:
    the backward runs fused_matmul_reduce_scatter. Under torch.compile it is
    torch.ops.symmem.fused_all_gather_matmul."""
    torch = _torch()
    bs = list(bs)
    if _compiling(torch):
        res = torch.ops.symmem.fused_all_gather_matmul(a_shard, bs, gather_dim, _group_name(group), return_a)
        return (res[0], list(res[1:])) if return_a else (None, list(res))
    if torch.is_grad_enabled() and (a_shard.requires_grad or any(b.requires_grad for b in bs)):
        a, *outs = _tp_autograd(torch)[0].apply(gather_dim, group, a_shard, *bs)
        return (a if return_a else None), outs
    return _ag_mm(torch, a_shard, bs, gather_dim, group, return_a)


def fused_matmul_reduce_scatter(a, b, reduce_op: str, scatter_dim: int, group=None):
    """torch.ops.symm_mem.fused_matmul_reduce_scatter on libsymmem:
    reduce_scatter(a @ b, reduce_op, scatter_dim) over group: reduce_op
    "sum" or "avg", accumulated in fp32 in rank order and rounded once;
    this rank keeps part rank of scatter_dim. The matmuls are torch's,
    chunk by destination rank; each chunk crosses into its rank's
    workspace while the next is computed. Differentiable: the backward runs
    fused_all_gather_matmul. Under torch.compile it is
    torch.ops.symmem.fused_matmul_reduce_scatter."""
    torch = _torch()
    if _compiling(torch):
        return torch.ops.symmem.fused_matmul_reduce_scatter(a, b, reduce_op, scatter_dim, _group_name(group))
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _tp_autograd(torch)[1].apply(reduce_op, scatter_dim, group, a, b)
    return _mm_rs(torch, a, b, reduce_op, scatter_dim, group)


_NORM_DTYPES = ("bfloat16", "float16", "float32")


def _run_rmsnorm(x, residual, weight, eps: float, out, group, algo, cpp_group: Optional[str] = None) -> None:
    """One all_reduce_rmsnorm; cpp_group as _run's."""
    from . import _tp

    torch = _torch_module or _torch()
    what = _tp.NORM
    tokens, hidden = _tp.rmsnorm_rows(tuple(x.shape), tuple(residual.shape), tuple(weight.shape))
    _tp_check(what, [("x", x), ("residual", residual), ("weight", weight), ("out", out)])
    name = str(x.dtype).replace("torch.", "")
    if name not in _NORM_DTYPES:
        raise ValueError(f"{what}: x is {x.dtype}; the norm takes bfloat16, float16 or float32")
    for n, t in (("x", x), ("residual", residual), ("weight", weight), ("out", out)):
        if not t.is_contiguous():
            raise ValueError(f"{what}: {n} must be contiguous")
    if tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"{what}: out has shape {tuple(out.shape)}, x {tuple(x.shape)}")
    dev = x.get_device()
    stream = _a2a_stream(torch, dev)
    gkey = _group_key(group)
    symmetric = (gkey, dev, x.data_ptr(), x.nbytes) in _fast or _is_symmem(x)
    algoc = 0 if algo is None else _coll.algo_code(algo, "all_reduce_rmsnorm")
    if symmetric:
        entry = _fast_entry(torch, x, group, dev)
        hptr = entry[2]
    else:
        g = _group_of_call(torch, group, dev, x.device)
        h, _ = _tp_workspace(torch, g, x.device, 1)
        hptr = int(h.handle.ptr)
        if (algoc in (0, _LOW_LATENCY) and h.handle.world_size > 1 and x.nbytes <= _ll_bytes(h)
                and x.data_ptr() % 16 == 0):
            # The fused call reads x where it lies (Note [Inputs outside
            # the block] in core/symm/coll): no copy into the workspace.
            rc = _a2a_fn("symmem_all_reduce_rmsnorm_from")(
                hptr, _coll.DTYPES[name], tokens, hidden, x.data_ptr(), residual.data_ptr(), weight.data_ptr(),
                float(eps), out.data_ptr(), algoc, stream)
            if rc:
                _lib.check(rc, what)
            if cpp_group is not None and algo is None and tokens:
                _cpp_remember(cpp_group, x, _CPP_NORM, hptr, _CPP_READ_IN_PLACE, h.handle.world_size)
            return
        h, _ = _tp_workspace(torch, g, x.device, x.nbytes)
        # The workspace's own tensor is this rank's block at the rendezvous
        # pointer: a slice of it, rather than a new tensor of get_buffer's
        # per call.
        t = _tp_workspaces[(id(g), _symmem_device(x.device))][0]
        t[:x.nbytes].view(x.dtype).view(x.shape).copy_(x)
        hptr = int(h.handle.ptr)
    outp = None if symmetric and out.data_ptr() == x.data_ptr() else out.data_ptr()
    rc = _a2a_fn("symmem_all_reduce_rmsnorm")(
        hptr, _coll.DTYPES[name], tokens, hidden, residual.data_ptr(), weight.data_ptr(), float(eps), outp, algoc,
        stream)
    if rc:
        _lib.check(rc, what)
    if cpp_group is not None and symmetric and tokens:
        _cpp_remember(cpp_group, x, _CPP_NORM, hptr, _CPP_ZERO_COPY, entry[3])


# (group argument as in _fast, device index) -> (group argument, the
# default process group then or None, its symmem Group): group_for's answer
# for a call's arguments, looked up without group_for's torch.distributed
# queries (Note [Eager collectives]); destroy_group drops its entries.
_groups_by_call: Dict[Tuple[Any, int], Tuple[Any, Any, Group]] = {}


def _group_of_call(torch, group, dev: int, device) -> Group:
    gkey = _group_key(group)
    e = _groups_by_call.get((gkey, dev))
    if e is not None and _entry_current(e, group, torch):
        return e[2]
    g = group_for(group, _symmem_device(device))
    _groups_by_call[(gkey, dev)] = (group, _world_pg(torch.distributed) if group is None else None, g)
    return g


# (id of a workspace's TorchHandle, its handle's address) ->
# symmem_low_latency_max_bytes of its group, asked once per handle.
_ll_bytes_of: Dict[Tuple[int, int], int] = {}


def _ll_bytes(th) -> int:
    key = (id(th), int(th.handle.ptr))
    n = _ll_bytes_of.get(key)
    if n is None:
        n = _ll_bytes_of[key] = int(_lib.lib().symmem_low_latency_max_bytes(key[1]))
    return n


def all_reduce_rmsnorm(x, residual, weight, eps: float, out=None, group=None, algo: Optional[str] = None):
    """The end of a tensor-parallel decode layer in one call: residual +=
    all_reduce(x); out = rms_norm(residual) * weight. x, residual and out
    have one shape (..., hidden), weight (hidden,), all of one dtype
    (bfloat16, float16 or float32; hidden a multiple of 8 up to 16384).
    Returns (out, residual); residual is updated in place, out defaults to
    a new tensor (out=x: in place). The all-reduce sums in rank order in
    fp32 and rounds once; the add and the norm round as include/symmem.h
    says, so the results are the same bits on every rank whose residual and
    weight are the same. Small calls are one kernel on the low-latency path;
    larger ones the all-reduce then one add-and-norm kernel (algo: None or
    "auto", "low_latency", "one_shot", "two_shot"). x is used in place when
    it is libsymmem memory (symmem.torch.empty: the first call on it
    rendezvouses), else staged in the group's workspace; every rank passes
    the same kind. Capturable in CUDA graphs. Under torch.compile it is
    torch.ops.symmem.all_reduce_rmsnorm."""
    torch = _torch()
    if out is None:
        out = torch.empty_like(x)
    if _compiling(torch):
        torch.ops.symmem.all_reduce_rmsnorm(x, residual, weight, float(eps), out, _group_name(group),
                                            algo or "auto")
        return out, residual
    _run_rmsnorm(x, residual, weight, eps, out, group, algo)
    return out, residual


# Note [Operators in C++]
#
# In compiled code every operator call goes through torch's dispatcher;
# a Python kernel there costs the crossing back into Python (the
# arguments boxed and wrapped, the GIL) and its own lines, more than the
# collective's launch. So the collectives' operators (_CPP_KERNELS: the
# all-reduce, all-gather and reduce-scatter forms, the all-reduce with
# RMSNorm and the all-to-alls) have C++ kernels where
# `python -m symmem build-torch-ops` built them for the
# installed torch (symmem/_torch_ops.cpp; symmem/_torch_ops.py says where
# the module lives; SYMMEM_TORCH_OPS=0 leaves it unloaded). A C++ kernel
# answers from a table of (group name, device, address, bytes,
# collective) -> (library handle, zero-copy, read in place or staged, the
# group's size, which gives a functional form its output's shape) and calls
# symmem_collective or symmem_collective_from itself on torch's current
# stream. What the table does not hold it passes to the Python kernel,
# defined as symmem::_py_<name>, which runs _run and enters what served
# the call (_cpp_remember): a libsymmem tensor's handle, dropped when the
# tensor's memory is (its _fast entry goes then too), or, for a tensor of
# torch's memory under the auto algorithm, the group's workspace that the
# low-latency path read it in place beside or that it was staged through
# (as _in_place keeps them: an address outside libsymmem's heap never
# becomes libsymmem memory, and the bytes and the collective, which decided
# the path, are the key). A staged all-reduce, all-gather or reduce-scatter
# runs in C++ as _run_staged does (the copy into the workspace on the
# current stream, the collective, the copy back where the result is not
# written straight); the entry holds the workspace it was staged through,
# which fits the call by construction (a grown workspace leaves the old one
# allocated and rendezvoused). A call on torch's memory that the Python
# kernel served (read in place or staged) also enters the group's
# workspace (_cpp_workspace): from then on an all-reduce, all-gather or
# reduce-scatter under the auto algorithm on a tensor the table does not
# hold (compiled code's intermediates move between calls) is decided in
# C++ as _run decides it: libsymmem memory (symmem_pointer_get_info) goes
# to Python, whose first call rendezvouses it on every rank; torch's
# memory is read in place where _reads_in_place would, else staged where
# it fits the workspace, else passed to Python, which grows it.
# destroy_group empties the table and the workspaces, so no entry outlives
# the handle it names. A failed library call is
# raised through symmem::_py_raise, which names the error as _run does.
# Where the module is missing, stale (another torch, another source) or
# fails to load, the Python kernels serve every operator.
_CPP_KERNELS = frozenset(("all_reduce_", "all_reduce_out", "all_reduce", "all_gather", "all_gather_out",
                          "reduce_scatter", "reduce_scatter_out", "all_reduce_rmsnorm", "all_to_all",
                          "all_to_all_out", "all_to_all_v", "all_to_all_v_2d", "all_to_all_v_2d_offset"))
_CPP_ZERO_COPY, _CPP_READ_IN_PLACE, _CPP_STAGED = 0, 1, 2
# The table's collectives of its own (_torch_ops.cpp's kNorm, kA2aV, ...).
_CPP_NORM, _CPP_A2A_V, _CPP_A2A_V_2D, _CPP_A2A_V_2D_OFFSET = -1, -2, -3, -4
_cpp_ops = None  # the loaded module's path, or None
_cpp_ops_error: Optional[str] = None  # why it was not loaded, where it was found
_cpp_watched: set = set()  # handles whose entries are dropped with their tensor's memory
_cpp_workspaces: Dict[Tuple[str, int], "_Workspace"] = {}  # (group name, device) -> the workspace entered


def _load_cpp_ops(torch) -> None:
    """Loads the C++ kernels (Note [Operators in C++]) if they were built
    for this torch; says nothing where they were not."""
    global _cpp_ops, _cpp_ops_error
    from . import _torch_ops

    if not _torch_ops.enabled():
        return
    try:
        path = _torch_ops.path(torch)
    except Exception as exc:  # noqa: BLE001 - an unreadable source: the Python kernels
        _cpp_ops_error = f"{type(exc).__name__}: {exc}"
        return
    if not path.exists():
        return
    try:
        # The library's functions first: without them the module is not
        # loaded at all (its kernels would displace the Python ones).
        library = _lib.lib()
        fns = [library.address(n) for n in (
            "symmem_collective", "symmem_collective_from", "symmem_all_reduce_rmsnorm",
            "symmem_all_reduce_rmsnorm_from", "symmem_all_to_all", "symmem_all_to_all_v", "symmem_all_to_all_v_2d",
            "symmem_all_to_all_v_2d_offset", "symmem_pointer_get_info")]
        dtypes = [(getattr(torch, n), c) for n, c in _coll.DTYPES.items() if hasattr(torch, n)]
        torch.ops.load_library(str(path))
        torch.ops.symmem._cpp_bind(
            *fns, [torch.empty(0, dtype=dt) for dt, _ in dtypes], [c for _, c in dtypes],
            list(_OPS), list(_OPS.values()), list(_coll.ALGOS), list(_coll.ALGOS.values()), _STAGED_DIRECT_MAX)
    except Exception as exc:  # noqa: BLE001 - reported by cpp_ops_info; the Python kernels serve
        _cpp_ops_error = f"{path}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return
    _cpp_ops = str(path)
    _library.define("_py_raise(Tensor tensor, int rc, str what) -> ()")
    for key in ("CPU", "CUDA"):
        _library.impl("_py_raise", lambda tensor, rc, what: _lib.check(rc, what), key)


def _cpp_remember(group: str, tensor, coll: int, hptr: int, mode: int, world: int, workspace=None) -> None:
    """Enters a call that _run served into the C++ kernels' table
    (workspace: a staged call's, whose handle hptr is)."""
    torch = _torch_module
    torch.ops.symmem._cpp_remember(group, tensor, coll, hptr, mode, world, workspace)
    if mode == _CPP_ZERO_COPY and hptr not in _cpp_watched:
        _cpp_watched.add(hptr)
        # Not at exit: the table goes with the process, and torch may be
        # half torn down by then.
        weakref.finalize(_owner(tensor), _cpp_forget, hptr).atexit = False


def _cpp_workspace(group: str, dev: int, ws: "_Workspace") -> None:
    """Enters group's staging workspace on dev, from which the C++ kernels
    decide the calls on tensors of torch's memory they have not seen."""
    _torch_module.ops.symmem._cpp_workspace(group, ws.tensor, ws.hptr, ws.world, ws.ll_bytes)
    _cpp_workspaces[(group, dev)] = ws


def _cpp_forget(hptr: int) -> None:
    """Drops the table's entries of hptr (0: all of them, and the
    workspaces)."""
    if _cpp_ops is None:
        return
    if hptr:
        _cpp_watched.discard(hptr)
    else:
        _cpp_watched.clear()
        _cpp_workspaces.clear()
    _torch_module.ops.symmem._cpp_forget(hptr)


def cpp_ops_info() -> Dict[str, Any]:
    """Whether the operators' C++ kernels serve this process (Note
    [Operators in C++]): loaded (the module's path or None), why a module
    found was not loaded, and the calls the table answered and passed on."""
    info: Dict[str, Any] = {"loaded": _cpp_ops, "error": _cpp_ops_error}
    if _cpp_ops is not None:
        hits, misses, entries = _torch_module.ops.symmem._cpp_stats()
        info.update(answered=hits, passed_to_python=misses, entries=entries)
    return info


# Note [Collectives as torch operators]
#
# Under torch.compile, symmem.torch's collectives are torch operators
# (namespace "symmem", a torch.library.Library with CPU and CUDA kernels),
# as vLLM's and SGLang's custom all-reduces are, so that a model calling
# them compiles with fullgraph=True and no graph break: the functional forms
# return a new tensor (all_reduce, all_gather, reduce_scatter, all_to_all:
# what compiled code uses, and what reduce-overhead captures), the in-place
# and out= forms mutate their argument (the schema's (a!)), which
# torch.compile functionalizes; each has a fake implementation (shapes
# only) for tracing. The group travels as its process group name ("" for
# the default group). Eager calls do not go through the dispatcher (Note
# [Eager collectives]): it would cost more than the collective's whole
# host path.
_ops_registered = False
_ops_lock = threading.Lock()


def _register_ops(torch) -> None:
    global _ops_registered
    if _ops_registered or not hasattr(getattr(torch, "library", None), "register_fake"):
        return  # registered, or a torch without torch.library.register_fake (< 2.4)
    with _ops_lock:
        if _ops_registered:
            return
        try:
            _define_ops(torch)
        except RuntimeError as exc:
            # Defined already (this module loaded twice, by another path):
            # the operators that exist are this module's.
            if "multiple times" not in str(exc) and "already" not in str(exc):
                raise
        _ops_registered = True


# The operators' library, kept for the process's life (the registrations
# last while it does).
_library = None


def _operator(torch, qualname: str, schema: str):
    """A decorator that defines qualname ("symmem::name") with schema and
    registers the function as its CPU and CUDA kernel; it returns an object
    whose register_fake decorates the fake implementation. A plain
    torch.library.Library registration: a call dispatches straight to the
    kernel, without the autograd and checking layers of
    torch.library.custom_op, which would cost more than the collective's
    host path in compiled code. Mutation is what the schema's (a!) says."""
    name = qualname.split("::", 1)[1]

    def wrap(fn):
        _library.define(name + schema)
        if name in _CPP_KERNELS and _cpp_ops is not None:
            # The C++ kernels serve name (Note [Operators in C++]); fn is
            # what they call for what their table does not hold.
            name_py = "_py_" + name
            _library.define(name_py + schema)
            for key in ("CPU", "CUDA"):
                _library.impl(name_py, functools.partial(fn, cpp=True), key)
        else:
            for key in ("CPU", "CUDA"):
                _library.impl(name, fn, key)

        class Registered:
            @staticmethod
            def register_fake(fake):
                torch.library.register_fake(qualname, fake, lib=_library)
                return fake

        return Registered

    return wrap


def _define_ops(torch) -> None:
    """Defines the operators and their fake implementations."""
    global _library
    _library = torch.library.Library("symmem", "FRAGMENT")
    _load_cpp_ops(torch)

    def op(qualname: str, schema: str):
        return _operator(torch, qualname, schema)

    def world(group: str) -> int:
        return torch.distributed.get_world_size(None if group == "" else _resolve_pg(torch, group))

    @op("symmem::all_reduce_", "(Tensor(a!) tensor, str op, str group, str algo) -> ()")
    def all_reduce_(tensor: Tensor, op: str, group: str, algo: str, cpp: bool = False) -> None:
        _run("all_reduce", _coll.ALL_REDUCE, tensor, _group_arg(group), op, None, None if algo == "auto" else algo,
             group if cpp else None)

    @all_reduce_.register_fake
    def _(tensor, op, group, algo):
        return None

    @op("symmem::all_reduce_out", "(Tensor tensor, Tensor(a!) out, str op, str group, str algo) -> ()")
    def all_reduce_out(tensor: Tensor, out: Tensor, op: str, group: str, algo: str, cpp: bool = False) -> None:
        _run("all_reduce", _coll.ALL_REDUCE, tensor, _group_arg(group), op, out, None if algo == "auto" else algo,
             group if cpp else None)

    @all_reduce_out.register_fake
    def _(tensor, out, op, group, algo):
        return None

    # The functional form (torch.ops.symm_mem.one_shot_all_reduce's shape):
    # no argument is mutated, so Inductor places it freely and
    # mode="reduce-overhead" captures it (mutated graph inputs would make
    # cudagraph trees skip the graph).
    @op("symmem::all_reduce", "(Tensor tensor, str op, str group, str algo) -> Tensor")
    def all_reduce_op(tensor: Tensor, op: str, group: str, algo: str, cpp: bool = False) -> Tensor:
        out = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
        _run("all_reduce", _coll.ALL_REDUCE, tensor, _group_arg(group), op, out, None if algo == "auto" else algo,
             group if cpp else None)
        return out

    @all_reduce_op.register_fake
    def _(tensor, op, group, algo):
        return torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)

    @op("symmem::all_gather", "(Tensor tensor, str group) -> Tensor")
    def all_gather_op(tensor: Tensor, group: str, cpp: bool = False) -> Tensor:
        return _all_gather(torch, tensor, _group_arg(group), None, None, group if cpp else None)

    @all_gather_op.register_fake
    def _(tensor, group):
        return tensor.new_empty(_gather_shape(tensor, world(group)))

    @op("symmem::all_gather_out", "(Tensor tensor, Tensor(a!) out, str group) -> ()")
    def all_gather_out(tensor: Tensor, out: Tensor, group: str, cpp: bool = False) -> None:
        _all_gather(torch, tensor, _group_arg(group), out, None, group if cpp else None)

    @all_gather_out.register_fake
    def _(tensor, out, group):
        return None

    @op("symmem::reduce_scatter", "(Tensor tensor, str op, str group) -> Tensor")
    def reduce_scatter_op(tensor: Tensor, op: str, group: str, cpp: bool = False) -> Tensor:
        return _reduce_scatter(torch, tensor, op, _group_arg(group), None, None, group if cpp else None)

    @reduce_scatter_op.register_fake
    def _(tensor, op, group):
        return tensor.new_empty(_scatter_shape(tensor, world(group)))

    @op("symmem::reduce_scatter_out", "(Tensor tensor, Tensor(a!) out, str op, str group) -> ()")
    def reduce_scatter_out(tensor: Tensor, out: Tensor, op: str, group: str, cpp: bool = False) -> None:
        _reduce_scatter(torch, tensor, op, _group_arg(group), out, None, group if cpp else None)

    @reduce_scatter_out.register_fake
    def _(tensor, out, op, group):
        return None

    @op("symmem::all_to_all", "(Tensor input, str group) -> Tensor")
    def all_to_all_op(input: Tensor, group: str, cpp: bool = False) -> Tensor:
        out = torch.empty(input.shape, dtype=input.dtype, device=input.device)
        _run_all_to_all(input, out, _group_arg(group), False, group if cpp else None)
        return out

    @all_to_all_op.register_fake
    def _(input, group):
        return input.new_empty(input.shape)

    @op("symmem::all_to_all_out", "(Tensor input, Tensor(a!) out, str group) -> ()")
    def all_to_all_out(input: Tensor, out: Tensor, group: str, cpp: bool = False) -> None:
        _run_all_to_all(input, out, _group_arg(group), False, group if cpp else None)

    @all_to_all_out.register_fake
    def _(input, out, group):
        return None

    # The v forms mutate out and out_splits_offsets; their fakes check the
    # shapes, as the eager calls do, so that a mistake shows when tracing.
    @op("symmem::all_to_all_v", "(Tensor input, Tensor(a!) out, Tensor in_splits, Tensor(b!) out_splits_offsets, str group) -> ()")
    def all_to_all_v_op(input: Tensor, out: Tensor, in_splits: Tensor, out_splits_offsets: Tensor, group: str,
                        cpp: bool = False) -> None:
        _run_all_to_all_v(input, out, in_splits, out_splits_offsets, _group_arg(group), group if cpp else None)

    @all_to_all_v_op.register_fake
    def _(input, out, in_splits, out_splits_offsets, group):
        w = world(group)
        _a2a_check("all_to_all_v", input, out,
                    (("in_splits", in_splits, (w,)), ("out_splits_offsets", out_splits_offsets, (2, w))))
        return None

    @op("symmem::all_to_all_v_2d",
        "(Tensor input, Tensor(a!) out, Tensor in_splits, Tensor(b!) out_splits_offsets, str group, "
        "int major_align) -> ()")
    def all_to_all_v_2d_op(input: Tensor, out: Tensor, in_splits: Tensor, out_splits_offsets: Tensor, group: str,
                           major_align: int, cpp: bool = False) -> None:
        _run_all_to_all_v_2d(input, out, in_splits, out_splits_offsets, _group_arg(group), major_align,
                             group if cpp else None)

    @all_to_all_v_2d_op.register_fake
    def _(input, out, in_splits, out_splits_offsets, group, major_align):
        s = in_splits.shape[0] if in_splits.dim() == 1 else -1
        _a2a_check("all_to_all_v_2d", input, out,
                   (("in_splits", in_splits, (s,)), ("out_splits_offsets", out_splits_offsets, (2, s))))
        return None

    @op("symmem::all_to_all_v_2d_offset",
        "(Tensor input, Tensor(a!) out, Tensor in_splits_offsets, Tensor(b!) out_splits_offsets, "
        "str group) -> ()")
    def all_to_all_v_2d_offset_op(input: Tensor, out: Tensor, in_splits_offsets: Tensor, out_splits_offsets: Tensor,
                                  group: str, cpp: bool = False) -> None:
        _run_all_to_all_v_2d_offset(input, out, in_splits_offsets, out_splits_offsets, _group_arg(group),
                                    group if cpp else None)

    @all_to_all_v_2d_offset_op.register_fake
    def _(input, out, in_splits_offsets, out_splits_offsets, group):
        s = tuple(in_splits_offsets.shape)
        _a2a_check("all_to_all_v_2d_offset", input, out,
                   (("in_splits_offsets", in_splits_offsets, s), ("out_splits_offsets", out_splits_offsets, s)))
        return None


    # The tensor-parallel operators. The fused matmuls' real results are
    # made contiguous so that they match their fakes' strides.
    @op("symmem::all_reduce_rmsnorm",
        "(Tensor x, Tensor(a!) residual, Tensor weight, float eps, Tensor(b!) out, str group, str algo) -> ()")
    def all_reduce_rmsnorm_op(x: Tensor, residual: Tensor, weight: Tensor, eps: float, out: Tensor, group: str,
                              algo: str, cpp: bool = False) -> None:
        _run_rmsnorm(x, residual, weight, eps, out, _group_arg(group), None if algo == "auto" else algo,
                     group if cpp else None)

    @all_reduce_rmsnorm_op.register_fake
    def _(x, residual, weight, eps, out, group, algo):
        from . import _tp

        _tp.rmsnorm_rows(tuple(x.shape), tuple(residual.shape), tuple(weight.shape))
        return None

    @torch.library.custom_op(
        "symmem::fused_all_gather_matmul", mutates_args=(),
        schema="(Tensor a_shard, Tensor[] bs, int gather_dim, str group, bool return_a) -> Tensor[]")
    def fused_all_gather_matmul_op(a_shard: Tensor, bs: List[Tensor], gather_dim: int, group: str,
                                   return_a: bool) -> List[Tensor]:
        a, outs = _ag_mm(torch, a_shard, list(bs), gather_dim, _group_arg(group), return_a)
        return [t.contiguous() for t in ([a] if return_a else []) + outs]

    @fused_all_gather_matmul_op.register_fake
    def _(a_shard, bs, gather_dim, group, return_a):
        from . import _tp

        a, outs = _tp.all_gather_matmul_shapes(tuple(a_shard.shape), [tuple(b.shape) for b in bs], gather_dim,
                                               world(group))
        return [a_shard.new_empty(s) for s in ([a] if return_a else []) + outs]

    @torch.library.custom_op(
        "symmem::fused_matmul_reduce_scatter", mutates_args=(),
        schema="(Tensor a, Tensor b, str reduce_op, int scatter_dim, str group) -> Tensor")
    def fused_matmul_reduce_scatter_op(a: Tensor, b: Tensor, reduce_op: str, scatter_dim: int, group: str) -> Tensor:
        return _mm_rs(torch, a, b, reduce_op, scatter_dim, _group_arg(group)).contiguous()

    @fused_matmul_reduce_scatter_op.register_fake
    def _(a, b, reduce_op, scatter_dim, group):
        from . import _tp

        return a.new_empty(_tp.matmul_reduce_scatter_shape(tuple(a.shape), tuple(b.shape), reduce_op, scatter_dim,
                                                           world(group)))


def _resolve_pg(torch, name: str):
    return torch.distributed.distributed_c10d._resolve_process_group(name)


def register_ops() -> None:
    """Registers symmem.torch's collectives as torch operators
    (torch.ops.symmem.*) now; symmem.torch does it at its first use of
    torch otherwise (Note [Collectives as torch operators])."""
    _register_ops(_torch())


# Registered at import where torch can be imported: a function compiled
# before any eager call of symmem.torch would otherwise meet the first
# registration (and its lock) while Dynamo traces it, which is a graph
# break. Without torch, importing this module still works; its functions
# say that torch is missing.
if importlib.util.find_spec("torch") is not None:
    _torch()
