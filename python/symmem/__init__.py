"""symmem: Python bindings of libsymmem (ctypes only).

libsymmem is a caching GPU allocator behind PyTorch's CUDAPluggableAllocator
ABI, symmetric memory across processes, and a host backend (shared CPU
memory) where there is no GPU. This package wraps its C API
(include/symmem.h) and needs neither torch nor numpy; the torch helpers live
in :mod:`symmem.torch`, which imports torch only when used.

The library is loaded on first use; see :mod:`symmem._lib` for where it is
looked for ($SYMMEM_LIBRARY, the package's own copy, <repo>/build).

Allocator::

    ptr = symmem.alloc(1 << 20)          # int address
    symmem.free(ptr)
    symmem.memory_stats()["allocated_bytes.all.current"]

Symmetric memory (mirrors torch.distributed._symmetric_memory)::

    with symmem.Group("job", rank, world) as g, symmem.empty(4096) as buf:
        with symmem.rendezvous(buf, g) as h:
            h.get_buffer(peer).memoryview()[0] = 1   # host backend
            h.barrier()
"""

from ._lib import HEADER_VERSION, LibraryNotFoundError, library_path, strerror
from ._version import __version__
from .info import info
from .allocator import (
    PointerInfo,
    alloc,
    backend_name,
    backend_notes,
    copy,
    device_count,
    empty_cache,
    thread_caches_drain,
    free,
    get_memory_limit,
    memory_stats,
    memset,
    pointer_info,
    record_stream,
    reset_peak_memory_stats,
    set_memory_fraction,
    set_memory_limit,
    validate,
    version,
    version_tuple,
)
from .buffer import Buffer, empty
from .errors import (
    AbortedError,
    BackendError,
    InternalError,
    InterruptedError,
    InvalidArgumentError,
    InvalidDeviceError,
    InvalidPointerError,
    InvalidStateError,
    MismatchError,
    OutOfMemoryError,
    PeerError,
    PermissionError,
    Result,
    SymmemError,
    TimeoutError,
    UnavailableError,
)
from .exchange import KeyValueAllGather
from .group import Group, Handle, rendezvous
from .tags import (
    tag_bytes,
    REGION_BACKUP,
    REGION_BACKUP_PAGEABLE,
    backup_pointer,
    pause,
    region,
    resume,
    set_backup_dir,
    set_default_tag,
    untagged,
)
from ._coll import collectives_load
from .group import Group, Handle, nccl_version, rendezvous


__all__ = [
    "collectives_load",
    "nccl_version",
    # tags and pause
    "REGION_BACKUP",
    "REGION_BACKUP_PAGEABLE",
    "backup_pointer",
    "set_backup_dir",
    "set_default_tag",
    "tag_bytes",
    "untagged",
    "pause",
    "region",
    "resume",
    "HEADER_VERSION",
    "LibraryNotFoundError",
    "library_path",
    "info",
    "__version__",
    # allocator
    "PointerInfo",
    "alloc",
    "backend_name",
    "backend_notes",
    "copy",
    "device_count",
    "empty_cache",
    "thread_caches_drain",
    "free",
    "get_memory_limit",
    "memory_stats",
    "memset",
    "pointer_info",
    "record_stream",
    "reset_peak_memory_stats",
    "set_memory_fraction",
    "set_memory_limit",
    "validate",
    "version",
    "version_tuple",
    # buffers and symmetric memory
    "Buffer",
    "empty",
    "Group",
    "Handle",
    "rendezvous",
    "KeyValueAllGather",
    # errors
    "Result",
    "SymmemError",
    "AbortedError",
    "BackendError",
    "InternalError",
    "InterruptedError",
    "InvalidArgumentError",
    "InvalidDeviceError",
    "InvalidPointerError",
    "InvalidStateError",
    "MismatchError",
    "OutOfMemoryError",
    "PeerError",
    "PermissionError",
    "TimeoutError",
    "UnavailableError",
    "strerror",
]
