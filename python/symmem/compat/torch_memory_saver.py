"""torch_memory_saver's API (0.0.10) on libsymmem's tags, pause and resume.

``from symmem.compat.torch_memory_saver import torch_memory_saver`` gives an
object with torch_memory_saver's names and meanings; after
:func:`symmem.compat.install`, ``import torch_memory_saver`` gives it too, so
an unchanged program runs on libsymmem. Nothing here pauses memory itself:
a torch_memory_saver tag T is one libsymmem tag per kind of host copy its
regions asked for ("tms.T", "tms.T.cpu", "tms.T.mmap", "tms.T.disk"), and pause/resume
of T are symmem_pause/symmem_resume of those.

Differences from torch_memory_saver (each an error or a line of
docs/dropin.md, never silent):

- The empty tag "" is an error (torch_memory_saver treats it as every tag).
- Tags are 1 to 55 characters of letters, digits, '.', '_', '-'.
- Pausing a paused tag, or resuming a live one, raises
  :class:`symmem.InvalidStateError` (a RuntimeError; torch_memory_saver
  exits the process). A tag partly paused (a pause or resume that failed
  half-way) is neither: ``pause`` finishes it and ``resume`` takes it back.
  ``pause(None)`` / ``resume(None)`` act on every tag that is not yet in
  the target state, and raise the same only if none is left.
- Every error is also the type torch_memory_saver raises there
  (:func:`symmem.compat.original_error`): RuntimeError, ValueError, and
  torch.OutOfMemoryError when memory runs out.
- Pausing or resuming a tag that no region used does nothing (as there).
- Allocating in a region of a paused tag fails (libsymmem keeps a tag's
  memory whole; torch reports it as out of memory); torch_memory_saver makes
  a new live allocation.
- Without CPU backup the contents after a resume are undefined, as there
  (no zero-fill: ``symmem_resume_with(SYMMEM_RESUME_NO_FILL)``).
- ``get_cpu_backup`` of a paused tensor without backup raises
  :class:`symmem.InvalidStateError` (torch_memory_saver aborts).
- Host copies are held from the pause to the resume and given back at the
  resume unless ``retain_cpu_backup`` keeps them (at the same address, reused
  by the next pause), as there; a given-back pinned copy stays pinned ahead
  of the next pause within SYMMEM_BACKUP_PIN_AHEAD (default: a quarter of
  the host memory, shared among the machine's GPUs; 0: none, as
  torch_memory_saver), so that pauses stay at copy speed.
- ``memory_margin_bytes`` accepts 0 only: use ``symmem.set_memory_limit``.
- ``get_cpu_backup`` of a disk-backed tensor returns its copy (read from
  the file) where torch_memory_saver returns None.
- ``hook_mode`` "preload" and "torch" both mean libsymmem's allocator, and
  ``cuda_graph`` works in both.
- ``TMS_INIT_ENABLE=1`` takes effect at ``import torch_memory_saver`` (the
  drop-in's), which must come before the process's first CUDA allocation
  (libsymmem becomes torch's allocator then); torch_memory_saver's preloaded
  library acts at process start. Every allocation outside regions carries
  the tag "default" on every thread (libsymmem's default tag).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from typing import Dict, Iterator, Optional

from .. import tags as _tags
from . import _check_tag, _env_bool, _original_errors
from ..errors import InvalidArgumentError, InvalidStateError, Result, SymmemError, brief, quote

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess"]

_TAG_DEFAULT = "default"
_PREFIX = "tms."
# The kinds of host copy a region may ask for: torch_memory_saver's name ->
# (suffix of the libsymmem tag, symmem.region's backup).
_KINDS = {
    "none": ("", False),
    "pinned": (".cpu", "pinned"),
    "mmap": (".mmap", "pageable"),
    "disk": (".disk", "disk"),
}
_MAX_TAG = 64 - len(_PREFIX) - max(len(s) for s, _ in _KINDS.values())
_HOOK_MODES = ("preload", "torch")


class TorchMemorySaver:
    """torch_memory_saver's ``TorchMemorySaver`` on libsymmem.

    ``memory`` chooses where allocations come from (default: torch tensors
    through libsymmem's MemPools; :class:`symmem.compat._memory.BufferMemory`
    for libsymmem's own buffers, without torch).
    """

    def __init__(self, memory=None):
        self._memory = memory
        self._lock = threading.RLock()
        self._tags: Dict[str, set] = {}  # torch_memory_saver tag -> libsymmem tags
        # libsymmem tag -> "live", "paused" or "partly" (a pause or resume
        # failed half-way, on some devices): never stuck, the next pause
        # finishes a partly paused tag and the next resume takes it back.
        self._state: Dict[str, str] = {}
        self._impl = None  # torch_memory_saver's private object, as far as its tests use it
        self._local = threading.local()  # .depth: regions open on this thread
        self._retain = _env_bool("TMS_RETAIN_CPU_BACKUP")
        self._hook_mode = "preload"
        self._disk_dir = os.environ.get("TMS_DISK_BACKUP_DIR")
        self._default_backend = os.environ.get("TMS_INIT_CPU_BACKUP_BACKEND") or "pinned"
        self._initialized = False
        self._init_enable = False

    # -- set-up --------------------------------------------------------------

    def _ensure_initialized(self) -> None:
        """Pick the memory and honour TMS_INIT_ENABLE / TMS_INIT_ENABLE_CPU_BACKUP
        (every allocation of the process in tag "default", with or without
        a CPU copy): libsymmem becomes torch's allocator with a default tag."""
        with self._lock:
            if self._initialized:
                return
            if self._default_backend not in ("pinned", "mmap"):
                raise ValueError(f"TMS_INIT_CPU_BACKUP_BACKEND={brief(self._default_backend)}: expected 'pinned' or 'mmap'")
            if self._memory is None:
                from ._memory import default_memory

                self._memory = default_memory("torch_memory_saver")
            if self._disk_dir:
                _tags.set_backup_dir(self._disk_dir)
            if _env_bool("TMS_INIT_ENABLE"):
                kind = self._kind(
                    _env_bool("TMS_INIT_ENABLE_CPU_BACKUP"), _env_bool("TMS_INIT_ENABLE_DISK_BACKUP"), None
                )
                self._memory.make_global_allocator()
                tag, backup = self._symmem_tag(_TAG_DEFAULT, kind)
                _tags.set_default_tag(tag, backup=backup, own_device=True)
                self._init_enable = True
            self._impl = _Impl(self)
            self._initialized = True

    def _symmem_tag(self, tag, kind: str):
        """The libsymmem tag (and its backup) for tag's regions of kind."""
        _check_tag("torch_memory_saver", tag, _MAX_TAG, ' (it is not "every tag": pass None)')
        suffix, backup = _KINDS[kind]
        name = _PREFIX + tag + suffix
        with self._lock:
            self._tags.setdefault(tag, set()).add(name)
        return name, backup

    def _kind(self, enable_cpu_backup: bool, enable_disk_backup: bool, cpu_backup_backend) -> str:
        if cpu_backup_backend is not None:
            if not enable_cpu_backup:
                raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")
            if cpu_backup_backend not in ("pinned", "mmap"):
                raise ValueError(f"cpu_backup_backend must be 'pinned', 'mmap' or None, not {brief(cpu_backup_backend)}")
        if enable_cpu_backup and enable_disk_backup:
            raise ValueError("enable_cpu_backup and enable_disk_backup are mutually exclusive")
        if enable_disk_backup:
            return "disk"
        if not enable_cpu_backup:
            return "none"
        return cpu_backup_backend or self._default_backend

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1

    # -- regions ---------------------------------------------------------------

    @contextlib.contextmanager
    def region(
        self,
        tag: str = _TAG_DEFAULT,
        enable_cpu_backup: bool = False,
        enable_disk_backup: bool = False,
        cpu_backup_backend: Optional[str] = None,
    ) -> Iterator[None]:
        """Allocations of this thread inside the block are pauseable under
        ``tag``; with ``enable_cpu_backup`` their contents survive a pause
        (``cpu_backup_backend``: "pinned", the default, or "mmap")."""
        kind = self._kind(enable_cpu_backup, enable_disk_backup, cpu_backup_backend)
        self._ensure_initialized()
        name, backup = self._symmem_tag(tag, kind)
        with self._memory.allocation_scope(name, backup), self._counted():
            yield

    @contextlib.contextmanager
    def cuda_graph(
        self,
        cuda_graph,
        pool=None,
        stream=None,
        capture_error_mode: str = "global",
        tag: str = _TAG_DEFAULT,
        enable_cpu_backup: bool = False,
        cpu_backup_backend: Optional[str] = None,
    ) -> Iterator[None]:
        """``torch.cuda.graph`` whose memory is pauseable under ``tag``: the
        graph replays at the same addresses after a resume."""
        kind = self._kind(enable_cpu_backup, False, cpu_backup_backend)
        self._ensure_initialized()
        name, backup = self._symmem_tag(tag, kind)
        with self._memory.graph_scope(cuda_graph, pool, stream, capture_error_mode, name, backup), self._counted():
            yield

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        """Inside a region: this thread's allocations in the block are not
        pauseable."""
        self._ensure_initialized()
        if getattr(self._local, "depth", 0) == 0 and not self._init_enable:
            raise InvalidStateError(Result.INVALID_STATE, "torch_memory_saver.disable() is only allowed inside a region (or with TMS_INIT_ENABLE=1)")
        with self._memory.untagged_scope():
            yield

    # -- pause and resume ----------------------------------------------------

    def _targets(self, tag: Optional[str], call: str):
        if tag is None:
            return sorted(n for names in self._tags.values() for n in names)
        if not isinstance(tag, str):
            raise TypeError(f"tag must be a str or None, not {type(tag).__name__}")
        if tag == "":
            raise InvalidArgumentError(Result.INVALID_ARGUMENT, f'torch_memory_saver.{call}(""): the empty tag is refused (it is not "every tag": pass None)')
        return sorted(self._tags.get(tag, ()))

    def _settle(self, name: str) -> None:
        """After a failed pause or resume of name: its state as the library
        has it (paused and live bytes; a tag without segments keeps the
        state it had)."""
        try:
            live, paused = _tags.tag_bytes(name)
        except SymmemError:
            return
        if paused and live:
            self._state[name] = "partly"
        elif paused:
            self._state[name] = "paused"
        elif live:
            self._state[name] = "live"

    def _change(self, tag: Optional[str], call: str, to: str) -> None:
        """Pause (to="paused") or resume (to="live") the libsymmem tags of
        tag, each one that is not in that state yet. A failure leaves every
        one of them paused, live or partly (tag_states says which) and is
        raised; the same call again finishes the rest."""
        self._ensure_initialized()
        with self._lock, _original_errors():
            names = self._targets(tag, call)
            todo = [n for n in names if self._state.get(n, "live") != to]
            if names and not todo:
                what = "already paused" if to == "paused" else "not paused"
                raise InvalidStateError(
                    Result.INVALID_STATE, f"torch_memory_saver.{call}({'None' if tag is None else quote(tag)}): {what}: {', '.join(names)}"
                )
            for n in todo:
                try:
                    if to == "paused":
                        _tags.pause(n)
                    else:
                        _tags.resume(n, zero=False, backup="retain" if self._retain else "release")
                except SymmemError:
                    self._settle(n)
                    raise
                self._state[n] = to

    def pause(self, tag: Optional[str] = None) -> None:
        """Release the memory of ``tag`` (None: every tag), keeping addresses;
        tags with CPU backup copy their contents to the host first."""
        self._change(tag, "pause", "paused")

    def resume(self, tag: Optional[str] = None) -> None:
        """Take back the memory of ``tag`` (None: every tag) at the same
        addresses; contents restored with CPU backup, undefined without. The
        host copies are given back unless ``retain_cpu_backup`` is set."""
        self._change(tag, "resume", "live")

    def tag_states(self) -> Dict[str, str]:
        """libsymmem's drop-in only: the state of each libsymmem tag of this
        object ("tms.T", "tms.T.cpu", ...): "live", "paused" or "partly"."""
        with self._lock:
            return {n: self._state.get(n, "live") for names in self._tags.values() for n in sorted(names)}

    # -- CPU copies --------------------------------------------------------

    def get_cpu_backup(self, x, zero_copy: bool = False):
        """The CPU copy of tensor ``x``: while paused, the copy the pause
        made; while live, the copy a resume with ``retain_cpu_backup``
        kept (at the same address), else None. ``zero_copy`` gives a view of
        the copy itself. A paused tensor without CPU backup raises
        InvalidStateError."""
        self._ensure_initialized()
        ptr, nbytes, contiguous = self._memory.tensor_memory(x)
        if not contiguous:
            raise ValueError("torch_memory_saver.get_cpu_backup needs a contiguous tensor")
        with _original_errors():
            host, paused = _tags.backup_state(ptr, max(nbytes, 1))
            if host is None:
                if paused:
                    raise InvalidStateError(
                        Result.INVALID_STATE,
                        f"torch_memory_saver.get_cpu_backup: the tensor at {ptr:#x} is paused and has no CPU copy (its region had enable_cpu_backup=False)",
                    )
                return None
        return self._memory.cpu_copy(host, x, zero_copy)

    @property
    def retain_cpu_backup(self) -> bool:
        """Whether a resume keeps the host copies (at their addresses, for
        get_cpu_backup and the next pause) instead of giving them back."""
        return self._retain

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value: bool) -> None:
        self._retain = bool(value)

    # -- configuration -------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return True

    @property
    def hook_mode(self):
        raise AttributeError("hook_mode can only be set")

    @hook_mode.setter
    def hook_mode(self, value: str) -> None:
        if value not in _HOOK_MODES:
            raise ValueError(f"hook_mode must be one of {_HOOK_MODES}, not {brief(value)}")
        self._hook_mode = value  # both are libsymmem's allocator

    @property
    def memory_margin_bytes(self):
        raise NotImplementedError("Only setter is supported")

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value: int) -> None:
        if int(value) != 0:
            raise NotImplementedError(
                "torch_memory_saver.memory_margin_bytes: libsymmem's drop-in has no free-memory margin; bound libsymmem with symmem.set_memory_limit(device, bytes)"
            )

    def set_disk_backup_dir(self, path: str) -> None:
        """The directory of disk backups (process-wide, made if missing):
        symmem.set_backup_dir."""
        os.makedirs(path, exist_ok=True)
        _tags.set_backup_dir(path)
        self._disk_dir = path


class _PoolsView:
    """torch_memory_saver's ``_impl._mem_pools``, keyed as there by (tag,
    enable_cpu_backup, enable_disk_backup, resolved backend, device), over
    the drop-in's pools (its tests pop a pool to free a tag's memory)."""

    def __init__(self, saver: "TorchMemorySaver") -> None:
        self._saver = saver

    def _key(self, key):
        tag, cpu, disk, backend, device = key
        kind = self._saver._kind(bool(cpu), bool(disk), backend or None)
        return (_PREFIX + tag + _KINDS[kind][0], device)

    def _pools(self) -> dict:
        return getattr(self._saver._memory, "_pools", {})

    def pop(self, key, *default):
        return self._pools().pop(self._key(key), *default)

    def get(self, key, default=None):
        return self._pools().get(self._key(key), default)

    def __getitem__(self, key):
        return self._pools()[self._key(key)]

    def __contains__(self, key) -> bool:
        return self._key(key) in self._pools()

    def __len__(self) -> int:
        return len(self._pools())

    def clear(self) -> None:
        self._pools().clear()


class _CudaRuntime:
    """torch_memory_saver's ``_impl._binary_wrapper.cdll`` as far as its
    tests use it: the CUDA runtime's functions (cudaHostGetFlags,
    cudaGetLastError) from the libcudart this process has loaded."""

    def __init__(self) -> None:
        self._lib = None

    def _load(self):
        if self._lib is None:
            path = None
            try:
                with open("/proc/self/maps") as f:
                    for line in f:
                        if "libcudart" in line and "/" in line:
                            path = line[line.index("/") :].strip()
                            break
            except OSError:
                pass
            if path is None:
                raise AttributeError("torch_memory_saver (libsymmem's drop-in): no CUDA runtime (libcudart) is loaded in this process")
            self._lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_GLOBAL)
        return self._lib

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._load(), name)


class _BinaryWrapper:
    def __init__(self) -> None:
        self.cdll = _CudaRuntime()


class _Impl:
    """What torch_memory_saver's tests reach through ``torch_memory_saver._impl``:
    ``_mem_pools``, ``_with_region_config``, ``_binary_wrapper.cdll`` (the
    CUDA runtime only), ``_hook_mode``, ``_is_xpu``. Not an API."""

    _is_xpu = False

    def __init__(self, saver: "TorchMemorySaver") -> None:
        self._saver = saver
        self._mem_pools = _PoolsView(saver)
        self._binary_wrapper = _BinaryWrapper()

    @property
    def _hook_mode(self) -> str:
        return self._saver._hook_mode

    @contextlib.contextmanager
    def _with_region_config(self, tag: str, enable_cpu_backup: bool, cpu_backup_backend=None, enable_disk_backup: bool = False):
        kind = self._saver._kind(enable_cpu_backup, enable_disk_backup, cpu_backup_backend)
        name, backup = self._saver._symmem_tag(tag, kind)
        with _tags.region(name, backup=backup, own_device=True):
            yield


torch_memory_saver = TorchMemorySaver()


@contextlib.contextmanager
def configure_subprocess() -> Iterator[None]:
    """Subprocesses started inside the block import libsymmem's drop-in as
    ``torch_memory_saver`` (PYTHONPATH names its shim directory)."""
    from . import _subprocess_env

    old = os.environ.get("PYTHONPATH")
    os.environ.update(_subprocess_env(os.environ))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
