"""vLLM's sleep-mode allocator API on libsymmem's tags, pause and resume.

``from symmem.compat.vllm import CuMemAllocator`` in place of
``from vllm.device_allocator.cumem import CuMemAllocator`` gives the same
names and meanings (vllm/device_allocator/cumem.py and its ``MemAllocator``
protocol): ``get_instance()``, ``use_memory_pool(tag=None)``,
``sleep(offload_tags=None)``, ``discard(tags)``, ``wake_up(tags=None)``,
``get_current_usage()``. A vLLM tag T is the libsymmem tag "vllm.T": sleep
is symmem_pause of every live tag (keeping a host copy for the offloaded
ones, discarding the others), wake_up is symmem_resume. :func:`register`
is a ``vllm.general_plugins`` entry point that registers the sleep-mode
backend "symmem" where vLLM has sleep-mode backends, and with
SYMMEM_VLLM_ALLOCATOR=1 makes vLLM's own ``CuMemAllocator.get_instance()``
return this one (vLLM unchanged).

Differences from vLLM (each an error or a line of docs/dropin.md):

- Tags are 1 to 59 characters of letters, digits, '.', '_', '-'; "" is an
  error.
- Tags named in ``CuMemAllocator.offload_ahead`` (default: "weights", what
  vLLM's level-1 sleep offloads) pin their host copy when their memory is
  allocated, in the background, so the first sleep runs at copy speed; other
  offloaded tags pin at their first sleep. wake_up gives the host copies
  back, as vLLM does; a pinned one stays pinned ahead of the next sleep
  within SYMMEM_BACKUP_PIN_AHEAD (default: a quarter of the host memory,
  shared among the machine's GPUs; 0: none, as vLLM).
- Allocating in a tag while it sleeps raises.
- get_instance() without torch raises RuntimeError saying so (vLLM:
  AssertionError "cumem allocator is not available").
- Errors are libsymmem's exceptions that are also what vLLM raises there
  (:func:`symmem.compat.original_error`): a wake_up without room raises
  one that is a RuntimeError (torch.OutOfMemoryError). A sleep or wake_up
  that fails half-way leaves each tag asleep, awake or partly asleep (the
  next sleep finishes it, the next wake_up takes it back): retry the call.
- ``use_cudagraph_pool`` / ``release_cudagraph_pool`` raise
  NotImplementedError: capture graphs inside ``use_memory_pool`` instead.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Dict, Iterable, Iterator, Optional, Set, Tuple, Union

from .. import tags as _tags
from ..errors import SymmemError
from . import _check_tag, _env_bool, _original_errors

__all__ = ["CuMemAllocator", "SymmemSleepBackend", "register"]

_PREFIX = "vllm."
_MAX_TAG = 64 - len(_PREFIX)


def _as_tuple(tags: Union[str, Iterable[str]]) -> Tuple[str, ...]:
    if isinstance(tags, str):
        return (tags,)
    return tuple(tags)


class CuMemAllocator:
    """vLLM's ``CuMemAllocator`` on libsymmem (a singleton: use
    :meth:`get_instance`)."""

    instance: "Optional[CuMemAllocator]" = None
    default_tag: str = "default"
    offload_ahead: Tuple[str, ...] = ("weights",)
    _instance_lock = threading.Lock()

    @staticmethod
    def get_instance() -> "CuMemAllocator":
        with CuMemAllocator._instance_lock:
            if CuMemAllocator.instance is None:
                inst = CuMemAllocator()
                inst._mem()  # torch, or RuntimeError in one line
                CuMemAllocator.instance = inst
            return CuMemAllocator.instance

    def __init__(self, memory=None):
        self._memory = memory
        self._lock = threading.RLock()
        self._tags: Dict[str, bool] = {}  # vLLM tag -> pinned ahead (the libsymmem tag's backup)
        self._asleep: Set[str] = set()
        # Tags that a sleep or wake_up left partly asleep (some devices).
        self._partly: Set[str] = set()
        self.current_tag: str = CuMemAllocator.default_tag

    def _mem(self):
        if self._memory is None:
            from ._memory import default_memory

            self._memory = default_memory("CuMemAllocator")
        return self._memory

    def _name(self, tag: str) -> str:
        _check_tag("CuMemAllocator", tag, _MAX_TAG)
        return _PREFIX + tag

    @contextlib.contextmanager
    def use_memory_pool(self, tag: Optional[str] = None) -> Iterator[None]:
        """Allocations of this thread inside the block go to the pool of
        ``tag`` (default "default") and sleep with it."""
        if tag is None:
            tag = CuMemAllocator.default_tag
        name = self._name(tag)
        with self._lock:
            ahead = self._tags.setdefault(tag, tag in self.offload_ahead)
        old = self.current_tag
        self.current_tag = tag
        try:
            with self._mem().allocation_scope(name, "pinned" if ahead else False):
                yield
        finally:
            self.current_tag = old

    def _settle(self, tag: str) -> None:
        """After a failed sleep or wake_up of tag: asleep, awake or partly
        asleep, as the library has it."""
        try:
            live, paused = _tags.tag_bytes(self._name(tag))
        except SymmemError:
            return
        self._partly.discard(tag)
        if paused and live:
            self._partly.add(tag)
            self._asleep.discard(tag)
        elif paused:
            self._asleep.add(tag)
        elif live:
            self._asleep.discard(tag)

    def _pause(self, tag: str, backup: bool) -> None:
        try:
            _tags.pause(self._name(tag), backup=backup)
        except SymmemError:
            self._settle(tag)
            raise
        self._partly.discard(tag)
        self._asleep.add(tag)

    def sleep(self, offload_tags: Union[Tuple[str, ...], str, None] = None) -> None:
        """Release every awake tag's memory: tags in ``offload_tags`` (default
        ("default",)) keep a host copy, the others are discarded. Tags
        already asleep keep what their sleep decided."""
        offload = (CuMemAllocator.default_tag,) if offload_tags is None else _as_tuple(offload_tags)
        with self._lock, _original_errors():
            for tag in sorted(self._tags):
                if tag in self._asleep:
                    continue
                self._pause(tag, tag in offload)
        self._mem().release_cached()

    def discard(self, tags: Union[Tuple[str, ...], str]) -> None:
        """Release the memory of the awake ``tags`` without keeping it."""
        with self._lock, _original_errors():
            for tag in sorted(set(_as_tuple(tags))):
                if tag not in self._tags or tag in self._asleep:
                    continue
                self._pause(tag, False)

    def wake_up(self, tags: Optional[Iterable[str]] = None) -> None:
        """Take back the memory of the sleeping ``tags`` (None: every tag) at
        the same addresses: offloaded contents restored, the rest undefined
        (no fill, as vLLM); the host copies are given back."""
        want = None if tags is None else set(_as_tuple(tags))
        with self._lock, _original_errors():
            for tag in sorted(self._asleep | self._partly):
                if want is not None and tag not in want:
                    continue
                try:
                    _tags.resume(self._name(tag), zero=False, backup="release")
                except SymmemError:
                    self._settle(tag)
                    raise
                self._asleep.discard(tag)
                self._partly.discard(tag)

    def get_current_usage(self) -> int:
        """Bytes of device memory in the pools of every tag, awake or
        asleep (the size of what the tags hold when awake)."""
        with self._lock:
            return sum(sum(_tags.tag_bytes(self._name(tag))) for tag in self._tags)

    def use_cudagraph_pool(self, pool=None):
        raise NotImplementedError("CuMemAllocator.use_cudagraph_pool: not in libsymmem's drop-in; capture CUDA graphs inside use_memory_pool(tag)")

    def release_cudagraph_pool(self, pool) -> None:
        raise NotImplementedError("CuMemAllocator.release_cudagraph_pool: not in libsymmem's drop-in")


class SymmemSleepBackend:
    """vLLM's sleep-mode backend interface (suspend, resume, discard) on
    :class:`CuMemAllocator`; level 1 offloads "weights", level 2 discards
    everything."""

    def __init__(self) -> None:
        self._state = "RUNNING"

    def suspend(self, level: int = 1) -> None:
        self._state = "SUSPENDED"
        CuMemAllocator.get_instance().sleep(offload_tags=("weights",) if level == 1 else tuple())

    def resume(self, tags=None) -> None:
        self._state = "RESUMING"
        CuMemAllocator.get_instance().wake_up(tags)
        self._state = "RUNNING"

    def discard(self, tags) -> None:
        CuMemAllocator.get_instance().discard(tags)
        self._state = "SUSPENDED"

    def state(self) -> str:
        return self._state

    @classmethod
    def is_supported(cls) -> bool:
        return True

    @classmethod
    def preserves_communicators(cls) -> bool:
        return True

    @classmethod
    def preserves_compiled_artifacts(cls) -> bool:
        return True

    @classmethod
    def preserves_graphs_with_communicators(cls) -> bool:
        return False

    @classmethod
    def supports_durable_storage(cls) -> bool:
        return False


def register() -> bool:
    """The ``vllm.general_plugins`` entry point: registers the sleep-mode
    backend "symmem" with vLLM's SleepModeBackendFactory where vLLM has one.
    With SYMMEM_VLLM_ALLOCATOR=1 it also makes vLLM's own
    ``CuMemAllocator.get_instance()`` (and so ``get_mem_allocator_instance()``)
    return this module's allocator, so that vLLM's worker allocates and
    sleeps through libsymmem without any change. Returns whether vLLM was
    found."""
    try:
        import vllm.device_allocator.cumem as cumem
    except ImportError:
        return False
    try:
        from vllm.device_allocator.sleep_mode_backend import SleepModeBackendFactory
    except ImportError:
        SleepModeBackendFactory = None
    if SleepModeBackendFactory is not None and "symmem" not in getattr(SleepModeBackendFactory, "_registry", {}):
        SleepModeBackendFactory.register_backend("symmem", __name__, "SymmemSleepBackend")
    if _env_bool("SYMMEM_VLLM_ALLOCATOR"):
        cumem.CuMemAllocator.get_instance = staticmethod(CuMemAllocator.get_instance)
    return True
