"""Finding and loading libsymmem.so, and the ctypes prototypes of symmem.h.

The library is looked for, in order, at

1. ``$SYMMEM_LIBRARY`` (a path to the .so; when set it is the only place
   tried, so that a wrong value is an error rather than a silent fallback),
2. the package's own copy, ``symmem/libsymmem.so`` (what a wheel ships),
3. the system loader's path: ``libsymmem.so.0`` through LD_LIBRARY_PATH and
   the ld.so cache (where ``make install`` puts it; ctypes.util.find_library),
4. the build folder, ``<repo>/build/libsymmem.so``, only when the package
   runs from a source tree.

The error lists every place tried and why each failed.

Every function of include/symmem.h is declared here with its argtypes and
restype. A function that the loaded library lacks (an older or partial build) is replaced by a stub that raises
:class:`symmem.UnavailableError` naming the symbol, so that the allocator can be
used from a library that only has the allocator.

Nothing here needs torch or numpy.
"""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int64,
    c_size_t,
    c_uint,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Callable, List, Optional, TypeVar

from .errors import C_INT, Result, UnavailableError, env_bool, int_arg, make_error, quote

__all__ = [
    "LibraryNotFoundError",
    "SymmemStat",
    "SymmemPointerInfo",
    "ALLGATHER_FN",
    "HEADER_VERSION",
    "candidates",
    "find_library",
    "lib",
    "library_path",
    "has",
    "check",
    "check_pointer",
    "check_last_error",
    "error_from_last",
    "strerror",
]

# The version of include/symmem.h these prototypes were written against
# (SYMMEM_VERSION_MAJOR * 10000 + MINOR * 100 + PATCH).
# (from _version.py, which scripts/version.sh writes from the VERSION file).
from ._version import VERSION_MAJOR as HEADER_VERSION_MAJOR  # noqa: E402
from ._version import VERSION_MINOR as HEADER_VERSION_MINOR  # noqa: E402
from ._version import VERSION_PATCH as HEADER_VERSION_PATCH  # noqa: E402

HEADER_VERSION = HEADER_VERSION_MAJOR * 10000 + HEADER_VERSION_MINOR * 100 + HEADER_VERSION_PATCH

LIBRARY_NAME = "libsymmem.so"
ENV_LIBRARY = "SYMMEM_LIBRARY"

_PACKAGE_DIR = Path(__file__).resolve().parent
# python/symmem/_lib.py -> python/symmem -> python -> <repo>
_REPO_DIR = _PACKAGE_DIR.parent.parent


class LibraryNotFoundError(ImportError):
    """libsymmem.so could not be found or loaded; the message lists where."""


# --------------------------------------------------------------------------
# Structures, exactly as in symmem.h
# --------------------------------------------------------------------------


class SymmemStat(Structure):
    """``struct symmem_stat { const char *key; int64_t value; }``."""

    _fields_ = [("key", c_char_p), ("value", c_int64)]


class SymmemPointerInfo(Structure):
    """``struct symmem_pointer_info`` (see symmem.h)."""

    _fields_ = [
        ("block", c_void_p),
        ("block_size", c_size_t),
        ("requested_size", c_size_t),
        ("offset", c_size_t),
        ("heap_offset", c_uint64),
        ("device", c_int),
        ("reserved_", c_int),
    ]


class SymmemKernelInfo(Structure):
    """``struct symmem_kernel_info`` (see symmem.h)."""

    _fields_ = [
        ("arch", c_int),
        ("from_cache", c_int),
        ("compile_ms", c_double),
        ("load_ms", c_double),
        ("compiler", ctypes.c_char * 256),
        ("cache_path", ctypes.c_char * 512),
    ]


class SymmemHandleDesc(Structure):
    """``struct symmem_handle_desc`` (see symmem.h)."""

    _fields_ = [
        ("rank", c_int),
        ("world_size", c_int),
        ("buffer_size", c_size_t),
        ("offset", c_size_t),
        ("signal_pad_size", c_size_t),
        ("buffer_ptrs", POINTER(c_void_p)),
        ("signal_pad_ptrs", POINTER(c_void_p)),
        ("buffer_ptrs_dev", c_void_p),
        ("signal_pad_ptrs_dev", c_void_p),
    ]


# int (*symmem_allgather_fn)(const void *send, void *recv,
#                            size_t bytes_per_rank, void *user);
ALLGATHER_FN = CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t, c_void_p)

# Opaque handle types and the stream type are all plain pointers.
_group_p = c_void_p
_handle_p = c_void_p
_stream_t = c_void_p
_result = c_int  # enum symmem_result

# name -> (restype, argtypes)
PROTOTYPES = {
    # Version, errors, backend
    "symmem_version": (c_int, []),
    "symmem_strerror": (c_char_p, [_result]),
    "symmem_last_error": (_result, []),
    "symmem_last_error_message": (c_char_p, []),
    "symmem_copy_last_error": (c_size_t, [c_char_p, c_size_t]),
    "symmem_clear_last_error": (None, []),
    "symmem_backend_name": (c_char_p, []),
    "symmem_backend_notes": (c_char_p, []),
    "symmem_device_count": (c_int, []),
    "symmem_info_json": (c_size_t, [c_void_p, c_size_t]),
    "symmem_memory_snapshot_json": (c_size_t, [c_void_p, c_size_t]),
    "symmem_record_history": (_result, [c_size_t]),
    "symmem_set_context_hook": (_result, [c_void_p, c_void_p]),
    # The caching allocator
    "symmem_alloc": (c_void_p, [c_size_t, c_int, _stream_t]),
    "symmem_free": (None, [c_void_p, c_size_t, c_int, _stream_t]),
    "symmem_alloc_or_throw": (c_void_p, [c_size_t, c_int, _stream_t]),
    "symmem_record_stream": (None, [c_void_p, _stream_t]),
    "symmem_init": (None, [c_int]),
    "symmem_reset": (None, []),
    "symmem_memory_fraction": (None, [c_double, c_int]),
    "symmem_empty_cache": (_result, [c_int]),
    "symmem_set_memory_limit": (_result, [c_int, c_size_t]),
    "symmem_get_memory_limit": (_result, [c_int, POINTER(c_size_t)]),
    "symmem_stats": (c_size_t, [c_int, POINTER(SymmemStat), c_size_t]),
    "symmem_reset_peak_stats": (_result, [c_int]),
    "symmem_pointer_get_info": (_result, [c_void_p, POINTER(SymmemPointerInfo)]),
    "symmem_copy": (_result, [c_void_p, c_void_p, c_size_t, c_int, _stream_t]),
    "symmem_memset": (_result, [c_void_p, c_int, c_size_t, c_int, _stream_t]),
    "symmem_validate": (_result, [c_int]),
    # Groups
    "symmem_group_create": (
        _result,
        [c_char_p, c_int, c_int, c_int, c_int64, POINTER(_group_p)],
    ),
    "symmem_group_create_with_allgather": (
        _result,
        [c_char_p, c_int, c_int, c_int, c_int64, ALLGATHER_FN, c_void_p, POINTER(_group_p)],
    ),
    "symmem_group_destroy": (_result, [_group_p]),
    "symmem_group_abort": (_result, [_group_p]),
    "symmem_set_interrupt_fd": (_result, [c_int]),
    "symmem_group_rank": (c_int, [_group_p]),
    "symmem_group_world_size": (c_int, [_group_p]),
    "symmem_group_device": (c_int, [_group_p]),
    "symmem_group_local_rank": (c_int, [_group_p]),
    "symmem_group_local_size": (c_int, [_group_p]),
    "symmem_group_is_local": (c_int, [_group_p, c_int]),
    "symmem_group_machine": (c_size_t, [_group_p, c_int, c_char_p, c_size_t]),
    "symmem_group_set_signal_pad_size": (_result, [_group_p, c_size_t]),
    # Rendezvous and handles
    "symmem_rendezvous": (_result, [c_void_p, _group_p, POINTER(_handle_p)]),
    "symmem_handle_release": (_result, [_handle_p]),
    "symmem_handle_rank": (c_int, [_handle_p]),
    "symmem_handle_world_size": (c_int, [_handle_p]),
    "symmem_handle_buffer_size": (c_size_t, [_handle_p]),
    "symmem_handle_offset": (c_size_t, [_handle_p]),
    "symmem_handle_signal_pad_size": (c_size_t, [_handle_p]),
    "symmem_handle_buffer_ptr": (c_void_p, [_handle_p, c_int]),
    "symmem_handle_signal_pad_ptr": (c_void_p, [_handle_p, c_int]),
    "symmem_handle_buffer_ptrs": (POINTER(c_void_p), [_handle_p]),
    "symmem_handle_signal_pad_ptrs": (POINTER(c_void_p), [_handle_p]),
    "symmem_handle_buffer_ptrs_dev": (c_void_p, [_handle_p]),
    "symmem_handle_signal_pad_ptrs_dev": (c_void_p, [_handle_p]),
    "symmem_handle_describe": (_result, [_handle_p, POINTER(SymmemHandleDesc)]),
    "symmem_handle_mapped_peers": (c_int, [_handle_p]),
    "symmem_thread_caches_drain": (_result, [c_int]),
    # Groups over an NCCL communicator
    "symmem_group_create_nccl": (_result, [c_void_p, c_char_p, c_int64, c_uint, POINTER(_group_p)]),
    "symmem_nccl_version": (c_int, []),
    "symmem_handle_nccl_window": (_result, [_handle_p, POINTER(c_void_p), POINTER(c_size_t)]),
    "symmem_group_nccl_window_counts": (
        _result,
        [_group_p, POINTER(c_int64), POINTER(c_int64), POINTER(c_int64)],
    ),
    # Signals
    "symmem_put_signal": (_result, [_handle_p, c_int, c_int, _stream_t]),
    "symmem_wait_signal": (_result, [_handle_p, c_int, c_int, c_int64, _stream_t]),
    "symmem_barrier": (_result, [_handle_p, c_int, c_int64, _stream_t]),
    # Tags and pause
    "symmem_region_begin": (_result, [c_char_p, c_uint]),
    "symmem_region_end": (_result, []),
    "symmem_set_default_tag": (_result, [c_char_p, c_uint]),
    "symmem_set_backup_dir": (_result, [c_char_p]),
    "symmem_pause": (_result, [c_char_p]),
    "symmem_pause_with": (_result, [c_char_p, c_uint]),
    "symmem_resume": (_result, [c_char_p]),
    "symmem_resume_with": (_result, [c_char_p, c_uint]),
    "symmem_tag_bytes": (_result, [c_char_p, POINTER(c_size_t), POINTER(c_size_t)]),
    "symmem_backup_pointer": (_result, [c_void_p, c_size_t, POINTER(c_void_p), POINTER(c_int)]),
    "symmem_pause_group": (_result, [_group_p, c_char_p]),
    "symmem_resume_group": (_result, [_group_p, c_char_p]),
    # Collectives
    "symmem_all_reduce": (_result, [_handle_p, c_int, c_int, c_size_t, c_void_p, _stream_t]),
    "symmem_all_gather": (_result, [_handle_p, c_int, c_size_t, c_void_p, _stream_t]),
    "symmem_reduce_scatter": (_result, [_handle_p, c_int, c_int, c_size_t, c_void_p, _stream_t]),
    "symmem_collective": (
        _result,
        [_handle_p, c_int, c_int, c_int, c_size_t, c_void_p, c_int, c_int, _stream_t],
    ),
    "symmem_collective_from": (
        _result,
        [_handle_p, c_int, c_int, c_int, c_size_t, c_void_p, c_void_p, c_int, c_int, _stream_t],
    ),
    "symmem_low_latency_max_bytes": (c_size_t, [_handle_p]),
    # All-to-all
    "symmem_all_to_all": (_result, [_handle_p, c_int, c_size_t, c_void_p, _stream_t]),
    "symmem_all_to_all_v": (
        _result,
        [_handle_p, c_size_t, c_void_p, c_void_p, c_size_t, c_void_p, _stream_t],
    ),
    "symmem_all_to_all_v_2d": (
        _result,
        [_handle_p, c_size_t, c_int, c_void_p, c_void_p, c_size_t, c_void_p, c_int64, _stream_t],
    ),
    "symmem_all_to_all_v_2d_offset": (
        _result,
        [_handle_p, c_size_t, c_int, c_void_p, c_void_p, c_size_t, c_void_p, _stream_t],
    ),
    # All-reduce with RMSNorm
    "symmem_all_reduce_rmsnorm": (
        _result,
        [_handle_p, c_int, c_size_t, c_size_t, c_void_p, c_void_p, c_float, c_void_p, c_int, _stream_t],
    ),
    "symmem_all_reduce_rmsnorm_from": (
        _result,
        [_handle_p, c_int, c_size_t, c_size_t, c_void_p, c_void_p, c_void_p, c_float, c_void_p, c_int, _stream_t],
    ),
    "symmem_handle_device_error": (_result, [_handle_p, POINTER(c_uint32)]),
    "symmem_collectives_load": (_result, [c_int, POINTER(SymmemKernelInfo)]),
}


# --------------------------------------------------------------------------
# Finding the library
# --------------------------------------------------------------------------


SONAME = "libsymmem.so.0"


def _repo_build_dir() -> Optional[Path]:
    """<repo>/build when this package runs from a source tree, else None."""
    if (_REPO_DIR / "go.mod").is_file() and (_REPO_DIR / "python" / "symmem").is_dir():
        return _REPO_DIR / "build"
    return None


def candidates() -> List[str]:
    """What is tried, in order (see the module docstring). Entries with a
    slash are paths; the others are names for the system's loader."""
    env = os.environ.get(ENV_LIBRARY)
    if env:
        return [env]
    out = [str(_PACKAGE_DIR / LIBRARY_NAME)]
    # The system loader's path (LD_LIBRARY_PATH, the ld.so cache: where
    # `make install` puts it). ctypes.util asks ldconfig for the real name.
    import ctypes.util

    found = ctypes.util.find_library("symmem")
    for name in (SONAME, found):
        if name and name not in out:
            out.append(name)
    build = _repo_build_dir()
    if build is not None:
        out.append(str(build / LIBRARY_NAME))
    return out


def _describe(c: str) -> str:
    if c == os.environ.get(ENV_LIBRARY):  # the user's path: quoted and cut (errors.quote)
        return quote(c)
    return c if "/" in c else f"{c} (through the system loader: LD_LIBRARY_PATH, ld.so cache)"


def _loader_reason(exc: BaseException, path: str) -> str:
    """The loader's message without the path it starts with (the path is
    quoted once, by the caller)."""
    text = str(exc)
    if path and path in text:
        text = text.replace(path, "", 1).lstrip(": ")
    return text


def _is_file(c: str) -> bool:
    try:
        return Path(c).is_file()
    except OSError:  # a name too long for the file system, for one
        return False


def _load_first() -> "Library":
    """Loads the first candidate that loads; LibraryNotFoundError lists
    every one tried with why it failed."""
    tried = []
    for c in candidates():
        if "/" in c and not _is_file(c):
            tried.append(f"  {_describe(c)}: no such file")
            continue
        try:
            return Library(c)
        except LibraryNotFoundError as exc:
            tried.append(f"  {_describe(c)}: {_loader_reason(exc.__cause__ or exc, c)}")
    where = "\n".join(tried)
    if os.environ.get(ENV_LIBRARY):
        hint = f"${ENV_LIBRARY} is set, so only it was tried"
        build = _repo_build_dir()
        if build is not None and not _is_file(os.environ[ENV_LIBRARY]) and Path(os.environ[ENV_LIBRARY]).parent == build:
            hint += f"; run `make` at {_REPO_DIR} to build it (Go and a C compiler; README.md, Install)"
    elif _repo_build_dir() is not None:  # a source tree: `make` builds build/libsymmem.so
        hint = (
            f"run `make` at {_REPO_DIR} to build build/libsymmem.so (Go and a C compiler; README.md, Install), "
            f"install the package with `pip install .` there, or set ${ENV_LIBRARY} to the library's path"
        )
    else:
        hint = (
            "install the package with `pip install .` at the repository root (it builds "
            f"the library), run `make install`, or set ${ENV_LIBRARY} to the library's path"
        )
    raise LibraryNotFoundError(f"libsymmem.so not found; tried, in order:\n{where}\n({hint})")


def find_library() -> Path:
    """The path of the library that would be loaded (loads it)."""
    return Path(lib().path)


class _Missing:
    """Stands for a function the loaded library does not export."""

    def __init__(self, name: str, path: Path):
        self.name = name
        self.path = path

    def __call__(self, *args, **kwargs):
        raise UnavailableError(
            Result.UNAVAILABLE,
            f"{self.name}: not exported by {self.path} (the library is older than "
            f"the package, or was built without this part)",
        )


class Library:
    """The loaded CDLL with prototypes; attributes are the C functions."""

    def __init__(self, path: "Path | str"):
        try:
            # RTLD_GLOBAL is not needed; the default mode keeps symbols local.
            self.cdll = ctypes.CDLL(str(path))
        except OSError as exc:
            raise LibraryNotFoundError(f"cannot load {quote(str(path))}: {_loader_reason(exc, str(path))}") from exc
        self.path = Path(_loaded_path(self.cdll) or str(path))
        self.missing: List[str] = []
        for name, (restype, argtypes) in PROTOTYPES.items():
            try:
                fn = getattr(self.cdll, name)
            except AttributeError:
                self.missing.append(name)
                setattr(self, name, _Missing(name, path))
                continue
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)
        if "symmem_version" not in self.missing:
            v = self.cdll.symmem_version()
            if v // 10000 != HEADER_VERSION_MAJOR:
                raise LibraryNotFoundError(
                    f"{path} is version {v}, but this package was written for "
                    f"major version {HEADER_VERSION_MAJOR} ({HEADER_VERSION})"
                )

    def has(self, name: str) -> bool:
        """Whether the library exports ``name``."""
        return name in PROTOTYPES and name not in self.missing

    def address(self, name: str) -> int:
        """The address of an exported function (for torch's set_*_fn hooks)."""
        return ctypes.cast(getattr(self.cdll, name), c_void_p).value


def _loaded_path(cdll: ctypes.CDLL) -> Optional[str]:
    """The file the loader picked for cdll (a bare soname becomes a path)."""
    try:
        fn = cdll.symmem_version
    except AttributeError:
        return None
    addr = ctypes.cast(fn, c_void_p).value or 0
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split()
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= addr < hi and len(parts) >= 6:
                    return parts[5]
    except OSError:
        pass
    return None


_lock = threading.Lock()
_library: Optional[Library] = None
# Set in a child forked after the library was loaded. The library runs a Go
# runtime, whose threads do not survive fork(): a call into it from such a
# child would hang, so it raises instead.
_forked_child = False


def _after_fork_in_child() -> None:
    global _forked_child
    _forked_child = True


def _refuse_forked_child() -> None:
    raise UnavailableError(
        Result.UNAVAILABLE,
        f"process {os.getpid()} was forked after libsymmem was loaded; the library's "
        "runtime does not survive fork(), so it cannot be used here: start processes "
        "with the 'spawn' method (multiprocessing.get_context('spawn')) or subprocess",
    )


def lib() -> Library:
    """The loaded library, loaded on first use (thread-safe)."""
    global _library
    if _forked_child:
        _refuse_forked_child()
    if _library is None:
        with _lock:
            if _library is None:
                _library = _load_first()
                os.register_at_fork(after_in_child=_after_fork_in_child)
    return _library


def library_path() -> str:
    """The path of the library in use (loads it if needed)."""
    return str(lib().path)


def has(name: str) -> bool:
    """Whether the loaded library exports the function ``name``."""
    return lib().has(name)


# Results into exceptions. They live here, beside the library handle, so that
# errors.py needs nothing from this module (no import circle).

def strerror(code: int) -> str:
    """The library's fixed description of a code."""
    code = int_arg(code, "code", "symmem.strerror", C_INT)
    s = lib().symmem_strerror(code)
    if not s or s == b"unknown result code":  # one static string for every unknown code
        return f"unknown result {int(code)}"
    return s.decode("utf-8", "replace")


def _last_message() -> str:
    s = lib().symmem_last_error_message()
    return s.decode("utf-8", "replace") if s else ""


def error_from_last(fallback_code: int = Result.INTERNAL, what: str = "") -> SymmemError:
    """An exception built from the calling thread's last error.

    When the last error is SUCCESS (the library failed without saying why),
    fallback_code and a message naming ``what`` are used instead.
    """
    code = int(lib().symmem_last_error())
    if code == Result.SUCCESS:
        return make_error(fallback_code, f"{what}: failed without setting an error")
    return make_error(code, _last_message())


def check(code: int, what: str = "") -> None:
    """Raise the matching SymmemError unless code is SUCCESS.

    The message is the thread's last error message when the last error has
    the same code (it always should), else the code's description.
    """
    code = int(code)
    if code == Result.SUCCESS:
        return
    library = lib()
    message = _last_message() if int(library.symmem_last_error()) == code else ""
    if not message:
        message = f"{what}: {strerror(code)}" if what else strerror(code)
    if code == Result.INTERRUPTED:
        # A signal ended the wait (install_interrupts): run the Python
        # handlers now, so that Ctrl-C raises KeyboardInterrupt here (in the
        # main thread; elsewhere, or when no handler raises, the error).
        ctypes.pythonapi.PyErr_CheckSignals()
    raise make_error(code, message)


# Interrupts (symmem_set_interrupt_fd): the read end of a pipe that CPython's
# C-level signal handler writes to (signal.set_wakeup_fd), or False when it
# could not be set up (not the main thread, or a wakeup fd of someone else).
_interrupts = None


def install_interrupts() -> bool:
    """Let signals (Ctrl-C) end the library's host-side waits: a wait in
    progress returns INTERRUPTED within about 50 ms and check() raises the
    signal's exception (KeyboardInterrupt). Set up once, from the main
    thread, unless another wakeup fd is set (asyncio's: then waits run to
    their end as before) or SYMMEM_PYTHON_INTERRUPTS is off (a boolean
    setting: 0/false/no/off; a value that is no boolean raises
    InvalidArgumentError, so a group is not made). Every signal that
    has a Python handler interrupts the waits in progress (CPython writes
    the wakeup fd for each); one whose handler does not raise leaves
    InterruptedError, and the group aborted. Returns whether it is on."""
    global _interrupts
    if _interrupts is not None:
        return bool(_interrupts)
    import signal

    wanted = env_bool("SYMMEM_PYTHON_INTERRUPTS", True)  # an unreadable value raises, every time
    if threading.current_thread() is not threading.main_thread():
        return False  # set_wakeup_fd is the main thread's; try again from there
    library = lib()  # loaded before _lock is taken (lib() takes it to load)
    with _lock:
        if _interrupts is not None:
            return bool(_interrupts)
        _interrupts = False
        if not wanted or not library.has("symmem_set_interrupt_fd"):
            return False
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(r)
            os.close(w)
            return False
        if old != -1:  # someone else's: leave it theirs
            signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return False
        if int(library.symmem_set_interrupt_fd(r)) != Result.SUCCESS:
            signal.set_wakeup_fd(-1)
            os.close(r)
            os.close(w)
            return False
        _interrupts = (r, w)
        return True


T = TypeVar("T")


def check_pointer(fn: Callable[..., Optional[int]], *args, what: str = "") -> int:
    """Call a pointer-returning function; raise from the last error on NULL.

    The last error is cleared first, so a stale error from an earlier call is
    never reported for this one.
    """
    library = lib()
    library.symmem_clear_last_error()
    ptr = fn(*args)
    if not ptr:
        raise error_from_last(what=what or getattr(fn, "__name__", "call"))
    return ptr


def check_last_error(fn: Callable[..., T], *args, what: str = "") -> T:
    """Call a function that reports failure only through the last error.

    For void functions such as symmem_free: clear, call, raise if set.
    """
    library = lib()
    library.symmem_clear_last_error()
    out = fn(*args)
    code = int(library.symmem_last_error())
    if code != Result.SUCCESS:
        raise make_error(code, _last_message())
    return out


# Note [The call module]
#
# Collectives, barriers and signals sit in their callers' loops, where a
# ctypes call (argument conversion through argtypes, a libffi frame) costs
# more than the library's own host path. symmem._calls (_calls.c) is the
# same calls as METH_FASTCALL functions of a small CPython extension, built
# with the package where a C compiler and Python's headers are found; it
# links neither libsymmem nor CUDA: bind() hands it the addresses of the
# functions of the library loaded here. Where it is missing (a checkout
# never built, a wheel built without a compiler) or SYMMEM_PYTHON_EXTENSION
# is off, calls() gives the ctypes functions under the same names and
# arguments, so callers never know which they have.


class _CtypesCalls:
    """The ctypes form of symmem._calls' functions (the fallback)."""

    extension = False

    def __init__(self, library: "Library"):
        self.collective = library.symmem_collective
        self.collective_from = library.symmem_collective_from
        self.barrier = library.symmem_barrier
        self.put_signal = library.symmem_put_signal
        self.wait_signal = library.symmem_wait_signal
        self.all_to_all = library.symmem_all_to_all
        info = SymmemPointerInfo()
        ref = ctypes.byref(info)
        get_info = library.symmem_pointer_get_info

        def is_symmem(ptr) -> bool:
            return bool(ptr) and get_info(ptr, ref) == 0

        self.is_symmem = is_symmem


class _ExtensionCalls:
    """symmem._calls bound to the loaded library."""

    extension = True

    def __init__(self, module, library: "Library"):
        module.bind(*(library.address(n) for n in _CALLS))
        self.module = module
        self.collective = module.collective
        self.collective_from = module.collective_from
        self.barrier = module.barrier
        self.put_signal = module.put_signal
        self.wait_signal = module.wait_signal
        self.all_to_all = module.all_to_all
        self.is_symmem = module.is_symmem


# The functions bind() takes, in its order.
_CALLS = ("symmem_collective", "symmem_barrier", "symmem_put_signal", "symmem_wait_signal",
          "symmem_pointer_get_info", "symmem_all_to_all", "symmem_collective_from")
_call_table = None
# Why the call module is not used, when it is not ("" when it is).
calls_fallback_reason = ""


def calls():
    """The per-call functions (Note [The call module]): collective,
    barrier, put_signal, wait_signal, all_to_all (the library's arguments;
    they return its result code) and is_symmem(address); ``.extension`` says
    whether they are symmem._calls' or ctypes'."""
    global _call_table, calls_fallback_reason
    if _call_table is not None:
        return _call_table
    library = lib()
    wanted = env_bool("SYMMEM_PYTHON_EXTENSION", True)
    with _lock:
        if _call_table is not None:
            return _call_table
        made = None
        if not wanted:
            calls_fallback_reason = "SYMMEM_PYTHON_EXTENSION is off"
        elif any(not library.has(n) for n in _CALLS):
            calls_fallback_reason = f"{library.path} lacks some of {', '.join(_CALLS)}"
        else:
            try:
                import importlib

                module = importlib.import_module(f"{__package__}._calls")
            except ImportError as exc:
                calls_fallback_reason = f"symmem._calls cannot be imported ({exc})"
            else:
                made = _ExtensionCalls(module, library)
                calls_fallback_reason = ""
        _call_table = made if made is not None else _CtypesCalls(library)
        return _call_table
