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
  :class:`symmem.InvalidStateError` (torch_memory_saver exits the process).
  ``pause(None)`` / ``resume(None)`` act on every tag and raise the same if
  one of them is already in the target state.
- Pausing or resuming a tag that no region used does nothing (as there).
- Allocating in a region of a paused tag fails (libsymmem keeps a tag's
  memory whole; torch reports it as out of memory); torch_memory_saver makes
  a new live allocation.
- Without CPU backup the contents after a resume are zero (torch_memory_saver
  leaves them undefined).
- ``get_cpu_backup`` of a paused tensor without backup raises
  :class:`symmem.InvalidStateError` (torch_memory_saver aborts).
- Host copies are kept across cycles whatever ``retain_cpu_backup`` says
  (later pauses never pin again); ``retain_cpu_backup`` only decides whether
  ``get_cpu_backup`` returns the copy of a live tensor.
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
import os
import threading
from typing import Dict, Iterator, Optional, Set

from .. import tags as _tags
from . import _check_tag, _env_bool
from ..errors import InvalidArgumentError, InvalidStateError, Result, brief

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
        self._tags: Dict[str, Set[str]] = {}  # torch_memory_saver tag -> libsymmem tags
        self._paused: Set[str] = set()  # libsymmem tags paused by this object
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

                self._memory = default_memory()
            if self._disk_dir:
                _tags.set_backup_dir(self._disk_dir)
            if _env_bool("TMS_INIT_ENABLE"):
                kind = self._kind(
                    _env_bool("TMS_INIT_ENABLE_CPU_BACKUP"), _env_bool("TMS_INIT_ENABLE_DISK_BACKUP"), None
                )
                self._memory.make_global_allocator()
                tag, backup = self._symmem_tag(_TAG_DEFAULT, kind)
                _tags.set_default_tag(tag, backup=backup)
                self._init_enable = True
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

    def pause(self, tag: Optional[str] = None) -> None:
        """Release the memory of ``tag`` (None: every tag), keeping addresses;
        tags with CPU backup copy their contents to the host first."""
        self._ensure_initialized()
        with self._lock:
            names = self._targets(tag, "pause")
            already = [n for n in names if n in self._paused]
            if already:
                raise InvalidStateError(Result.INVALID_STATE, f"torch_memory_saver.pause({tag!r}): already paused: {', '.join(already)}")
            for n in names:
                _tags.pause(n)
                self._paused.add(n)

    def resume(self, tag: Optional[str] = None) -> None:
        """Take back the memory of ``tag`` (None: every tag) at the same
        addresses; contents restored with CPU backup, zero without."""
        self._ensure_initialized()
        with self._lock:
            names = self._targets(tag, "resume")
            live = [n for n in names if n not in self._paused]
            if live:
                raise InvalidStateError(Result.INVALID_STATE, f"torch_memory_saver.resume({tag!r}): not paused: {', '.join(live)}")
            for n in names:
                _tags.resume(n)
                self._paused.discard(n)

    # -- CPU copies --------------------------------------------------------

    def get_cpu_backup(self, x, zero_copy: bool = False):
        """The CPU copy of tensor ``x``: while paused, the copy the pause
        made; while live, None, or the last pause's copy if
        ``retain_cpu_backup`` is set. A paused tensor without CPU backup
        raises InvalidStateError."""
        self._ensure_initialized()
        ptr, nbytes, contiguous = self._memory.tensor_memory(x)
        if not contiguous:
            raise ValueError("torch_memory_saver.get_cpu_backup needs a contiguous tensor")
        host, paused = _tags.backup_state(ptr, max(nbytes, 1))
        if host is None:
            if paused:
                raise InvalidStateError(Result.INVALID_STATE, 
                    f"torch_memory_saver.get_cpu_backup: the tensor at {ptr:#x} is paused and has no CPU copy (its region had enable_cpu_backup=False)"
                )
            return None
        if not paused and not self._retain:
            return None
        return self._memory.cpu_copy(host, x, zero_copy)

    @property
    def retain_cpu_backup(self) -> bool:
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
