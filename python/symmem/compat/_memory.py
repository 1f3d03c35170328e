"""Where the drop-ins' allocations come from: the thin part that knows torch.

The drop-ins (:mod:`symmem.compat.torch_memory_saver`,
:mod:`symmem.compat.vllm`) keep their logic (which tags exist, which are
paused, what a call means) in plain Python over libsymmem's tags, and ask a
*memory* object for the few things that depend on where the caller's
tensors come from:

- :class:`TorchMemory`: torch tensors. A tag's allocations go to a
  ``torch.cuda.MemPool`` of libsymmem (one per tag and device) inside a
  region of the tag, so torch's caching allocator caches within the tag and
  libsymmem sees one allocation per segment. Where libsymmem is torch's
  global allocator (``TMS_INIT_ENABLE=1``) torch caches nothing and makes
  no pools over it (a pluggable global allocator has none): every tensor
  is its own libsymmem allocation, and the region alone tags it.
- :class:`BufferMemory`: libsymmem's own allocations (``symmem.alloc``,
  ``symmem.empty``) inside a region, no torch: how the logic is tested on
  the host backend and the stand-in driver.

Every tag of the drop-ins maps its memory for its own GPU alone
(``own_device``, Note [Own-device tags] in core/alloc), as
torch_memory_saver's and vLLM's allocations are mapped: their resumes then
cost what the originals' do.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Any, Iterator, Optional, Tuple

from .. import allocator as _allocator
from .. import tags as _tags
from ..buffer import Buffer
from ..errors import brief


class BufferMemory:
    """Memory from libsymmem directly: regions only, no pools. "Tensors" are
    :class:`symmem.Buffer` objects or others with ``data_ptr()`` and
    ``nbytes``, always contiguous; CPU copies are ``bytes``
    (``memoryview`` for zero-copy)."""

    name = "buffers"

    @contextlib.contextmanager
    def allocation_scope(self, tag: str, backup) -> Iterator[None]:
        with _tags.region(tag, backup=backup, own_device=True):
            yield

    @contextlib.contextmanager
    def graph_scope(self, graph, pool, stream, capture_error_mode, tag: str, backup) -> Iterator[None]:
        # No graphs without torch: what a capture allocates is tagged as in
        # allocation_scope, and the graph object is only recorded.
        with _tags.region(tag, backup=backup, own_device=True):
            yield

    @contextlib.contextmanager
    def untagged_scope(self) -> Iterator[None]:
        # As torch_memory_saver's disable(): what the block allocated and
        # freed is given back when it exits (libsymmem's idle segments).
        try:
            with _tags.untagged():
                yield
        finally:
            _allocator.empty_cache()

    def tensor_memory(self, x) -> Tuple[int, int, bool]:
        if isinstance(x, Buffer):
            return x.ptr, x.nbytes, True
        if hasattr(x, "data_ptr") and hasattr(x, "nbytes"):
            return int(x.data_ptr()), int(x.nbytes), True
        raise TypeError(f"libsymmem's drop-in without torch takes a symmem.Buffer or an object with data_ptr() and nbytes, not {brief(x)}")

    def cpu_copy(self, host: int, x, zero_copy: bool):
        _, n, _ = self.tensor_memory(x)
        if n == 0:
            return b""
        buf = (ctypes.c_uint8 * n).from_address(host)
        return memoryview(buf).cast("B") if zero_copy else bytes(buf)

    def make_global_allocator(self) -> None:
        pass  # symmem.alloc is libsymmem already

    def release_cached(self) -> None:
        pass

    def pool_bytes(self) -> None:
        return None


class TorchMemory:
    """Memory of torch tensors on CUDA through libsymmem's MemPools."""

    name = "torch"

    def __init__(self, api: str = "symmem.compat") -> None:
        try:
            import torch
        except ImportError as exc:
            raise RuntimeError(
                f"{api} (libsymmem's drop-in) needs PyTorch, which cannot be imported here ({exc}); install torch"
            ) from None

        from .. import torch as symmem_torch

        self._torch = torch
        self._st = symmem_torch
        self._pools: dict = {}
        self._kept_pools: list = []  # disable() pools still holding tensors at the block's exit
        self._lock = threading.Lock()
        # libsymmem is torch's global allocator (make_global_allocator).
        self._global = False

    def pool(self, tag: str):
        """The MemPool of tag on the current device (made at first use)."""
        torch = self._torch
        key = (tag, torch.cuda.current_device())
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                pool = self._pools[key] = self._st.mem_pool()
        return pool

    @contextlib.contextmanager
    def allocation_scope(self, tag: str, backup) -> Iterator[None]:
        if self._global:
            with _tags.region(tag, backup=backup, own_device=True):
                yield
            return
        torch = self._torch
        with torch.cuda.use_mem_pool(self.pool(tag)), _tags.region(tag, backup=backup, own_device=True):
            yield

    @contextlib.contextmanager
    def graph_scope(self, graph, pool, stream, capture_error_mode, tag: str, backup) -> Iterator[None]:
        # The capture's allocations go to the tag's MemPool (unless the
        # caller shares another graph's pool), inside a region of the tag:
        # the graph's memory is paused with the tag, and the graph replays
        # at the same addresses after the resume.
        torch = self._torch
        if pool is None and not self._global:
            pool = self.pool(tag).id
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode):
            with _tags.region(tag, backup=backup, own_device=True):
                yield

    @contextlib.contextmanager
    def untagged_scope(self) -> Iterator[None]:
        # As torch_memory_saver's disable(): a fresh pool of the current
        # allocator, apart from the tags' pools, given back when the block
        # exits, so that what the block allocated and freed does not stay
        # cached. A pool that still holds tensors then is kept (torch must
        # not destroy a MemPool in use). Where libsymmem is torch's global
        # allocator, libsymmem's idle segments are released instead.
        if self._global:
            try:
                with _tags.untagged():
                    yield
            finally:
                _allocator.empty_cache()
            return
        torch = self._torch
        held = [torch.cuda.MemPool()]  # the only reference, so that _dispose can drop it
        try:
            with torch.cuda.use_mem_pool(held[0]), _tags.untagged():
                yield
        finally:
            self._dispose(held)

    def _dispose(self, held: list) -> None:
        """Give back the memory of a disable() block's pool (held: a list
        with the only reference to it)."""
        torch = self._torch
        pool = held.pop()
        try:
            in_use = any(seg.get("allocated_size", 0) for seg in pool.snapshot())
        except Exception:  # noqa: BLE001 - a torch without MemPool.snapshot
            in_use = False
        if in_use:
            with self._lock:
                self._kept_pools.append(pool)
            return
        del pool
        torch.cuda.empty_cache()

    def tensor_memory(self, x) -> Tuple[int, int, bool]:
        if not x.is_cuda:
            raise ValueError(f"expected a CUDA tensor, got one on {x.device}")
        return int(x.data_ptr()), int(x.numel() * x.element_size()), bool(x.is_contiguous())

    def cpu_copy(self, host: int, x, zero_copy: bool):
        torch = self._torch
        n = x.numel() * x.element_size()
        if n == 0:
            return torch.empty(x.shape, dtype=x.dtype)
        raw = torch.frombuffer((ctypes.c_uint8 * n).from_address(host), dtype=torch.uint8)
        out = raw.view(x.dtype).view(x.shape)
        return out if zero_copy else out.clone()

    def make_global_allocator(self) -> None:
        self._st.use_as_global_allocator()
        self._global = True

    def release_cached(self) -> None:
        import gc

        gc.collect()
        self._torch.cuda.empty_cache()


_default: Optional[Any] = None
_default_lock = threading.Lock()


def default_memory(api: str = "symmem.compat"):
    """The memory the drop-ins use unless given one: torch's (RuntimeError
    in one line naming api where torch cannot be imported)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = TorchMemory(api)
        return _default
