"""The drop-ins (symmem.compat) on the host backend and the stand-in driver,
without torch: torch_memory_saver's and vLLM's names with their meanings,
every misuse, install() and ``python -m symmem.compat`` in subprocesses.
The "tensors" are libsymmem allocations (BufferMemory); python/tests/gpu
runs the same programs with torch tensors."""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import subprocess
import sys
import textwrap
import threading

import pytest

import symmem
import symmem.compat
from symmem.compat import vllm as compat_vllm
from symmem.compat.__main__ import main as compat_main
from symmem.compat._memory import BufferMemory
from symmem.compat.torch_memory_saver import TorchMemorySaver

ON_FAKE = symmem.backend_name() == "cuda" and "fake" in os.environ.get("SYMMEM_LIBCUDA", "")
pytestmark = pytest.mark.skipif(
    symmem.backend_name() != "host" and not ON_FAKE, reason="CPU-addressable backends only (python/tests/gpu covers GPUs)"
)

MiB = 1 << 20
PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Tensor:
    """A stand-in for a torch tensor: a libsymmem allocation of n bytes."""

    def __init__(self, n: int, fill: int):
        self.ptr = symmem.alloc(n)
        self.nbytes = n
        ctypes.memset(self.ptr, fill, n)

    def data_ptr(self) -> int:
        return self.ptr

    def read(self, off: int = 0, n: int = 1) -> bytes:
        return ctypes.string_at(self.ptr + off, n)

    def all(self, value: int) -> bool:
        return ctypes.string_at(self.ptr, self.nbytes) == bytes([value]) * self.nbytes


_count = [0]


def unique(base: str) -> str:
    _count[0] += 1
    return f"{base}{os.getpid()}-{_count[0]}"


@pytest.fixture
def saver():
    return TorchMemorySaver(memory=BufferMemory())


def paused_bytes(saver_tag: str, kind: str = "") -> int:
    return symmem.tag_bytes("tms." + saver_tag + kind)[1]


# -- torch_memory_saver ------------------------------------------------------


def test_region_pause_resume_keeps_addresses_and_zeroes(saver):
    tag = unique("kv")
    with saver.region(tag=tag):
        x = Tensor(3 * MiB, 0x64)
    addr = x.ptr
    saver.pause(tag)
    assert paused_bytes(tag) >= 3 * MiB, "the physical memory was released"
    saver.resume(tag)
    assert x.ptr == addr and x.all(0), "same address; without backup the contents are zero"


def test_cpu_backup_pinned_and_mmap(saver):
    for backend in (None, "pinned", "mmap"):
        tag = unique("w")
        with saver.region(tag=tag, enable_cpu_backup=True, cpu_backup_backend=backend):
            x = Tensor(2 * MiB + 5, 42)
        saver.pause(tag)
        kind = ".mmap" if backend == "mmap" else ".cpu"
        assert paused_bytes(tag, kind) >= 2 * MiB
        copy = saver.get_cpu_backup(x)
        assert copy == bytes([42]) * x.nbytes, "get_cpu_backup of a paused tensor is its contents"
        view = saver.get_cpu_backup(x, zero_copy=True)
        assert isinstance(view, memoryview) and view[x.nbytes - 1] == 42
        del view
        saver.resume(tag)
        assert x.all(42), f"backend {backend}: the contents survived"
        assert saver.get_cpu_backup(x) is None, "given back at the resume (no retain_cpu_backup)"
        with pytest.raises(symmem.InvalidStateError):
            symmem.backup_pointer(x.ptr, 1)  # the copy went, not only hidden


def view_address(view: memoryview) -> int:
    return ctypes.addressof((ctypes.c_uint8 * len(view)).from_buffer(view))


@pytest.mark.parametrize("backend", ["pinned", "mmap"])
def test_retain_cpu_backup_keeps_one_host_address(saver, backend):
    """As torch_memory_saver's cpu_backup example: with retain_cpu_backup set
    before the resume, get_cpu_backup(zero_copy=True) gives the same host
    address after the resume and at the next pause, which refreshes it; a
    resume without it gives the copy back."""
    tag, other = unique("ret"), unique("oth")
    with saver.region(tag=tag, enable_cpu_backup=True, cpu_backup_backend=backend):
        x = Tensor(4096, 11)
    with saver.region(tag=other, enable_cpu_backup=True):
        y = Tensor(4096, 22)
    assert saver.retain_cpu_backup is False
    saver.pause(tag)
    first = saver.get_cpu_backup(x, zero_copy=True)
    addr = view_address(first)
    assert first[0] == 11 and y.all(22)
    saver.retain_cpu_backup = True
    del first
    saver.resume(tag)
    kept = saver.get_cpu_backup(x, zero_copy=True)
    assert view_address(kept) == addr and kept[4095] == 11, "retained at the same address"
    assert x.all(11)
    del kept
    saver.retain_cpu_backup = False
    again = saver.get_cpu_backup(x, zero_copy=True)
    assert view_address(again) == addr, "retain_cpu_backup decides at the resume, not at get_cpu_backup"
    del again
    ctypes.memset(x.ptr, 12, x.nbytes)
    saver.pause(tag)
    second = saver.get_cpu_backup(x, zero_copy=True)
    assert view_address(second) == addr and second[0] == 12, "the next pause reuses and refreshes it"
    saver.retain_cpu_backup = True
    del second
    saver.resume(tag)
    assert view_address(saver.get_cpu_backup(x, zero_copy=True)) == addr
    ctypes.memset(x.ptr, 13, x.nbytes)
    saver.pause(tag)
    saver.retain_cpu_backup = False
    saver.resume(tag)
    assert x.all(13) and saver.get_cpu_backup(x) is None, "a resume without retain gives it back"
    assert y.all(22)


def test_retain_cpu_backup_from_the_environment():
    out = _run(
        """
        from symmem.compat.torch_memory_saver import TorchMemorySaver
        print(TorchMemorySaver().retain_cpu_backup)
        """,
        env_extra={"TMS_RETAIN_CPU_BACKUP": "1"},
    )
    assert out.strip() == "True"


def test_freeing_a_tensor_frees_its_cpu_copy(saver):
    """torch_memory_saver frees an allocation's host copy with the
    allocation, paused or retained; so does the drop-in (the free that
    empties a segment)."""
    for retained in (True, False):
        tag = unique("free")
        with saver.region(tag=tag, enable_cpu_backup=True, cpu_backup_backend="mmap"):
            x = Tensor(MiB, 5)
        saver.retain_cpu_backup = retained
        saver.pause(tag)
        assert saver.get_cpu_backup(x) is not None
        if retained:
            saver.resume(tag)
            assert saver.get_cpu_backup(x) is not None
        symmem.free(x.ptr)
        host, _ = symmem.tags.backup_state(x.ptr, 1)
        assert host is None, "the copy went with the allocation"
        saver.retain_cpu_backup = False
        if not retained:
            saver.resume(tag)


def test_cpu_backup_backend_arguments(saver):
    with pytest.raises(ValueError, match="requires enable_cpu_backup"):
        with saver.region(tag=unique("a"), cpu_backup_backend="mmap"):
            pass
    with pytest.raises(ValueError, match="'pinned', 'mmap'"):
        with saver.region(tag=unique("a"), enable_cpu_backup=True, cpu_backup_backend="gpu"):
            pass
    with pytest.raises(ValueError, match="mutually exclusive"):
        with saver.region(tag=unique("a"), enable_cpu_backup=True, enable_disk_backup=True):
            pass


def test_multiple_tags_pause_independently(saver):
    t1, t2 = unique("type1"), unique("type2")
    with saver.region(tag=t1, enable_cpu_backup=True):
        a = Tensor(MiB, 1)
    with saver.region(tag=t2, enable_cpu_backup=True):
        b = Tensor(MiB, 2)
    saver.pause(t1)
    assert b.all(2), "type2 stays live while type1 is paused"
    saver.pause(t2)
    saver.resume(t2)
    assert b.all(2)
    saver.resume(t1)
    assert a.all(1)
    saver.pause()
    saver.resume()
    assert a.all(1) and b.all(2)


def test_one_tag_with_and_without_backup(saver):
    tag = unique("mixed")
    with saver.region(tag=tag, enable_cpu_backup=True):
        kept = Tensor(MiB, 9)
    with saver.region(tag=tag):
        dropped = Tensor(MiB, 8)
    saver.pause(tag)
    saver.resume(tag)
    assert kept.all(9) and dropped.all(0)


def test_nested_regions_of_different_tags(saver):
    outer, inner = unique("outer"), unique("inner")
    with saver.region(tag=outer, enable_cpu_backup=True):
        a = Tensor(MiB, 1)
        with saver.region(tag=inner):
            b = Tensor(MiB, 2)
        c = Tensor(MiB, 3)
    saver.pause(inner)
    assert a.all(1) and c.all(3), "the outer tag's allocations, before and after the inner region, stay"
    saver.resume(inner)
    assert b.all(0), "the inner region's allocation belonged to the inner tag"
    saver.pause(outer)
    saver.resume(outer)
    assert a.all(1) and c.all(3)


def test_misuse(saver):
    tag = unique("m")
    with saver.region(tag=tag):
        x = Tensor(MiB, 5)
    # Unknown tags: nothing to do, as in torch_memory_saver.
    saver.pause(unique("never"))
    saver.resume(unique("never"))
    assert x.all(5)
    # The empty tag is refused everywhere (it is not "every tag").
    for call in (saver.pause, saver.resume):
        with pytest.raises(symmem.InvalidArgumentError, match="empty"):
            call("")
    with pytest.raises(symmem.InvalidArgumentError, match="empty"):
        with saver.region(tag=""):
            pass
    with pytest.raises(symmem.InvalidArgumentError, match="letters"):
        with saver.region(tag="kv cache"):
            pass
    with pytest.raises(symmem.InvalidStateError, match="not paused"):
        saver.resume(tag)
    saver.pause(tag)
    with pytest.raises(symmem.InvalidStateError, match="already paused"):
        saver.pause(tag)
    with pytest.raises(symmem.InvalidStateError, match="already paused"):
        saver.pause()
    with pytest.raises(symmem.InvalidStateError, match="no CPU copy"):
        saver.get_cpu_backup(x)
    with pytest.raises(symmem.InvalidStateError):
        with saver.region(tag=tag):
            symmem.alloc(64)  # allocating in a paused tag
    saver.resume(tag)
    with pytest.raises(symmem.InvalidStateError, match="not paused"):
        saver.resume(tag)  # resume twice
    assert saver.get_cpu_backup(x) is None
    with pytest.raises(symmem.InvalidPointerError):
        saver.get_cpu_backup(_Foreign())  # memory libsymmem did not allocate


class _Foreign:
    nbytes = 16

    def __init__(self):
        self._buf = ctypes.create_string_buffer(16)

    def data_ptr(self):
        return ctypes.addressof(self._buf)


def test_disable(saver):
    with pytest.raises(symmem.InvalidStateError, match="inside a region"):
        with saver.disable():
            pass
    tag = unique("d")
    with saver.region(tag=tag):
        a = Tensor(MiB, 1)
        with saver.disable():
            b = Tensor(MiB, 2)
            with saver.region(tag=tag):
                c = Tensor(MiB, 3)
        d = Tensor(MiB, 4)
    saver.pause(tag)
    assert b.all(2), "allocations inside disable() are not pauseable"
    saver.resume(tag)
    assert a.all(0) and c.all(0) and d.all(0)


def test_disable_is_per_thread(saver):
    tag = unique("t")
    got = {}
    with saver.region(tag=tag):

        def other():
            try:
                with saver.disable():
                    pass
            except symmem.InvalidStateError as e:
                got["err"] = e

        th = threading.Thread(target=other)
        th.start()
        th.join()
    assert "err" in got, "a region on one thread does not open one on another"


def test_cuda_graph_tags_the_capture(saver):
    tag = unique("graph")
    graph = object()
    with saver.cuda_graph(graph, tag=tag, enable_cpu_backup=True):
        x = Tensor(MiB, 6)
    saver.pause(tag)
    assert paused_bytes(tag, ".cpu") >= MiB
    saver.resume(tag)
    assert x.all(6)
    with pytest.raises(ValueError, match="requires enable_cpu_backup"):
        with saver.cuda_graph(graph, tag=tag, cpu_backup_backend="pinned"):
            pass


def test_configuration_names(saver):
    assert saver.enabled is True
    for mode in ("preload", "torch"):
        saver.hook_mode = mode
    with pytest.raises(ValueError, match="hook_mode"):
        saver.hook_mode = "ld_preload"
    with pytest.raises(AttributeError):
        saver.hook_mode
    saver.memory_margin_bytes = 0
    with pytest.raises(NotImplementedError, match="set_memory_limit"):
        saver.memory_margin_bytes = 1 << 30
    with pytest.raises(NotImplementedError, match="setter"):
        saver.memory_margin_bytes


def test_disk_backup(saver, tmp_path):
    d = tmp_path / "a" / "b"
    saver.set_disk_backup_dir(str(d))
    assert d.is_dir()
    try:
        tag = unique("disk")
        with saver.region(tag=tag, enable_disk_backup=True):
            x = Tensor(2 * MiB, 0x2d)
        saver.pause(tag)
        assert paused_bytes(tag, ".disk") >= 2 * MiB
        assert saver.get_cpu_backup(x)[:4] == b"\x2d" * 4, "the copy, read from the file"
        assert list(d.iterdir()) == [], "the backup file is unlinked"
        saver.resume(tag)
        assert x.all(0x2d)
    finally:
        symmem.set_backup_dir(None)


def test_module_names():
    from symmem.compat import torch_memory_saver as m

    assert isinstance(m.torch_memory_saver, m.TorchMemorySaver)
    with m.configure_subprocess():
        assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == symmem.compat.SHIM_DIR
    assert os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] != symmem.compat.SHIM_DIR


def _run(code: str, env_extra=None, argv=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHON_DIR
    env.update(env_extra or {})
    cmd = argv or [sys.executable, "-c", textwrap.dedent(code)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p.stdout


CHILD = """
import torch_memory_saver as t
assert t.__symmem_dropin__, t.__file__
from torch_memory_saver import torch_memory_saver, TorchMemorySaver, configure_subprocess
print("child", type(torch_memory_saver).__module__)
"""


def test_install_reaches_this_process_and_subprocesses():
    out = _run(
        f"""
        import subprocess, sys
        import symmem.compat
        symmem.compat.install()
        assert symmem.compat.installed()
        import torch_memory_saver
        assert torch_memory_saver.__symmem_dropin__
        print("parent", type(torch_memory_saver.torch_memory_saver).__module__)
        subprocess.run([sys.executable, "-c", {CHILD!r}], check=True)
        """
    )
    assert "parent symmem.compat.torch_memory_saver" in out
    assert "child symmem.compat.torch_memory_saver" in out


def test_install_refuses_after_the_real_one():
    _run(
        """
        import sys, types
        sys.modules["torch_memory_saver"] = types.ModuleType("torch_memory_saver")
        import symmem.compat
        try:
            symmem.compat.install()
        except RuntimeError as e:
            assert "already imported" in str(e)
        else:
            raise SystemExit("install() accepted a real torch_memory_saver")
        """
    )


def test_python_m_symmem_compat_runs_an_unchanged_program(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(
        textwrap.dedent(
            """
            import ctypes, symmem
            from symmem.compat._memory import BufferMemory
            from torch_memory_saver import torch_memory_saver
            torch_memory_saver._memory = BufferMemory()
            with torch_memory_saver.region(enable_cpu_backup=True):
                p = symmem.alloc(1 << 20)
            ctypes.memset(p, 0x3c, 1 << 20)
            torch_memory_saver.pause()
            torch_memory_saver.resume()
            assert ctypes.string_at(p + 12345, 1) == b"\\x3c"
            print("ok")
            """
        )
    )
    out = _run("", argv=[sys.executable, "-m", "symmem.compat", "--", sys.executable, str(prog)])
    assert out.strip() == "ok"


@pytest.mark.parametrize("cmd, why", [
    ("", "empty"),
    ("no-such-program-" + "z" * 200, "No such file or directory"),
    ("a\0b", "null"),
])
def test_python_m_symmem_compat_cannot_run(cmd, why):
    """A program that cannot be run is one line and status 127, as a shell
    says it, never a traceback; the name is quoted and cut (Note [Bounded
    messages])."""
    for argv in (["--", cmd], [cmd]):
        if "\0" in cmd:  # no argument of a process holds a NUL: called in-process
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                rc = compat_main(argv)
            stderr = err.getvalue()
        else:
            p = subprocess.run([sys.executable, "-m", "symmem.compat", *argv], capture_output=True, text=True, timeout=60)
            rc, stderr = p.returncode, p.stderr
        assert rc == 127, (argv, rc, stderr)
        lines = stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("python -m symmem.compat: cannot run "), stderr
        assert why in lines[0] and "Traceback" not in stderr, stderr
        assert "z" * 65 not in lines[0], lines[0]


def test_get_cpu_backup_of_a_buffer(saver):
    """Without torch the drop-in's tensors are symmem.Buffer objects:
    get_cpu_backup reads their address and size (ptr, nbytes)."""
    tag = unique("buf")
    with saver.region(tag=tag, enable_cpu_backup=True):
        buf = symmem.empty(MiB + 3)
    buf.fill(0x5A)
    saver.pause(tag)
    copy = saver.get_cpu_backup(buf)
    assert copy == bytes([0x5A]) * (MiB + 3)
    view = saver.get_cpu_backup(buf, zero_copy=True)
    assert isinstance(view, memoryview) and len(view) == MiB + 3 and view[MiB + 2] == 0x5A
    del view
    saver.resume(tag)
    assert buf.read(MiB, 3) == bytes([0x5A]) * 3
    assert saver.get_cpu_backup(buf) is None
    with pytest.raises(TypeError, match="symmem.Buffer or an object with data_ptr\\(\\) and nbytes, not int 4096"):
        saver.get_cpu_backup(4096)
    buf.free()


def test_tms_init_enable_makes_every_allocation_pauseable():
    out = _run(
        """
        import ctypes, symmem
        from symmem.compat._memory import BufferMemory
        from symmem.compat.torch_memory_saver import TorchMemorySaver
        s = TorchMemorySaver(memory=BufferMemory())
        s._ensure_initialized()
        p = symmem.alloc(1 << 20)            # no region: the default tag
        ctypes.memset(p, 0x21, 1 << 20)
        with s.disable():
            q = symmem.alloc(4096)           # not pauseable
        ctypes.memset(q, 0x22, 4096)
        with s.region(tag="grad", enable_cpu_backup=False):
            g = symmem.alloc(1 << 20)
        ctypes.memset(g, 0x23, 1 << 20)
        s.pause()
        assert ctypes.string_at(q, 1) == b"\\x22"
        assert symmem.tag_bytes("tms.default.cpu")[1] >= 1 << 20
        s.resume()
        assert ctypes.string_at(p + 100, 1) == b"\\x21", "with CPU backup"
        assert ctypes.string_at(g, 1) == b"\\0", "the nested region without backup"
        print("ok")
        """,
        env_extra={"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"},
    )
    assert out.strip() == "ok"


def test_tms_init_enable_disk_backup(tmp_path):
    out = _run(
        """
        import ctypes, os, symmem
        from symmem.compat._memory import BufferMemory
        from symmem.compat.torch_memory_saver import TorchMemorySaver
        s = TorchMemorySaver(memory=BufferMemory())
        s._ensure_initialized()
        p = symmem.alloc(1 << 20)
        ctypes.memset(p, 0x31, 1 << 20)
        s.pause()
        assert symmem.tag_bytes("tms.default.disk")[1] >= 1 << 20
        s.resume()
        assert ctypes.string_at(p + 7, 1) == b"\\x31"
        print("ok")
        """,
        env_extra={"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_DISK_BACKUP": "1", "TMS_DISK_BACKUP_DIR": str(tmp_path / "d")},
    )
    assert out.strip() == "ok"


def test_tms_init_cpu_backup_backend_is_checked():
    _run(
        """
        from symmem.compat._memory import BufferMemory
        from symmem.compat.torch_memory_saver import TorchMemorySaver
        try:
            TorchMemorySaver(memory=BufferMemory())._ensure_initialized()
        except ValueError as e:
            assert "TMS_INIT_CPU_BACKUP_BACKEND" in str(e)
        else:
            raise SystemExit("a bad backend was accepted")
        """,
        env_extra={"TMS_INIT_CPU_BACKUP_BACKEND": "disk"},
    )


# -- vLLM ----------------------------------------------------------------------


@pytest.fixture
def allocator():
    return compat_vllm.CuMemAllocator(memory=BufferMemory())


def vtags(*names):
    return [unique(n) for n in names]


def test_vllm_sleep_offloads_and_discards(allocator):
    weights, kv = vtags("weights", "kv")
    with allocator.use_memory_pool(tag=weights):
        assert allocator.current_tag == weights
        w = Tensor(3 * MiB, 0x11)
    with allocator.use_memory_pool(tag=kv):
        k = Tensor(5 * MiB, 0x22)
    assert allocator.current_tag == "default"
    usage = allocator.get_current_usage()
    assert usage >= 8 * MiB
    allocator.sleep(offload_tags=(weights,))
    assert symmem.tag_bytes("vllm." + weights)[1] >= 3 * MiB and symmem.tag_bytes("vllm." + kv)[0] == 0
    assert allocator.get_current_usage() == usage, "usage counts sleeping pools too"
    allocator.sleep(offload_tags=(weights,))  # already asleep: nothing to do
    allocator.wake_up(tags=[weights])
    assert w.all(0x11) and symmem.tag_bytes("vllm." + kv)[1] >= 5 * MiB, "only the tags asked for"
    allocator.wake_up()
    assert k.all(0), "discarded: zero after wake_up"
    allocator.wake_up()  # nothing asleep: nothing to do


def test_vllm_defaults_and_discard(allocator):
    (other,) = vtags("other")
    with allocator.use_memory_pool():
        d = Tensor(MiB, 0x33)
    with allocator.use_memory_pool(other):
        o = Tensor(MiB, 0x44)
    allocator.discard(other)
    assert symmem.tag_bytes("vllm." + other)[1] >= MiB
    allocator.sleep()  # offloads "default"
    allocator.wake_up()
    assert d.all(0x33) and o.all(0)
    allocator.discard(("default", "never-used"))
    allocator.wake_up(["default"])
    assert d.all(0)


def test_vllm_offload_ahead_tags_get_pinned_backup(allocator):
    allocator.offload_ahead = ("weights",)
    with allocator.use_memory_pool("weights"):
        w = Tensor(MiB, 0x55)
    allocator.sleep(offload_tags="weights")
    allocator.wake_up()
    assert w.all(0x55)
    allocator.sleep(offload_tags=())  # a pinned-ahead tag can still be discarded
    allocator.wake_up()
    assert w.all(0)


def test_vllm_misuse(allocator):
    with pytest.raises(symmem.InvalidArgumentError, match="empty"):
        with allocator.use_memory_pool(""):
            pass
    with pytest.raises(TypeError):
        with allocator.use_memory_pool(3):
            pass
    with pytest.raises(NotImplementedError, match="use_memory_pool"):
        allocator.use_cudagraph_pool(None)
    with pytest.raises(NotImplementedError):
        allocator.release_cudagraph_pool(None)
    (tag,) = vtags("t")
    with allocator.use_memory_pool(tag):
        Tensor(MiB, 1)
    allocator.sleep()
    with pytest.raises(symmem.InvalidStateError):
        with allocator.use_memory_pool(tag):
            symmem.alloc(64)
    allocator.wake_up()


def _fake_vllm(monkeypatch):
    """A stand-in for vLLM's modules that the plugin touches."""
    import types

    vllm_mod = types.ModuleType("vllm")
    da = types.ModuleType("vllm.device_allocator")
    cumem = types.ModuleType("vllm.device_allocator.cumem")
    smb = types.ModuleType("vllm.device_allocator.sleep_mode_backend")

    class TheirAllocator:
        @staticmethod
        def get_instance():
            return "vllm's own"

    class Factory:
        _registry = {}

        @classmethod
        def register_backend(cls, name, module_path, class_name):
            if name in cls._registry:
                raise ValueError(f"{name} is already registered")
            cls._registry[name] = (module_path, class_name)

    cumem.CuMemAllocator = TheirAllocator
    smb.SleepModeBackendFactory = Factory
    vllm_mod.device_allocator = da
    da.cumem, da.sleep_mode_backend = cumem, smb
    for name, mod in (("vllm", vllm_mod), ("vllm.device_allocator", da), ("vllm.device_allocator.cumem", cumem),
                      ("vllm.device_allocator.sleep_mode_backend", smb)):
        monkeypatch.setitem(sys.modules, name, mod)
    return TheirAllocator, Factory


def test_vllm_plugin_registers_the_backend(monkeypatch):
    theirs, factory = _fake_vllm(monkeypatch)
    monkeypatch.delenv("SYMMEM_VLLM_ALLOCATOR", raising=False)
    assert compat_vllm.register() is True
    assert factory._registry["symmem"] == ("symmem.compat.vllm", "SymmemSleepBackend")
    assert compat_vllm.register() is True, "a second load registers nothing twice"
    assert theirs.get_instance() == "vllm's own", "vLLM's allocator is left alone by default"
    monkeypatch.setenv("SYMMEM_VLLM_ALLOCATOR", "1")
    inst = compat_vllm.CuMemAllocator(memory=BufferMemory())
    monkeypatch.setattr(compat_vllm.CuMemAllocator, "instance", inst)
    monkeypatch.setattr(theirs, "get_instance", theirs.get_instance)  # undone after the test
    assert compat_vllm.register() is True
    assert theirs.get_instance() is inst, "SYMMEM_VLLM_ALLOCATOR=1: vLLM's get_instance gives libsymmem's"
    monkeypatch.setenv("SYMMEM_VLLM_ALLOCATOR", "maybe")
    with pytest.raises(ValueError, match="SYMMEM_VLLM_ALLOCATOR"):
        compat_vllm.register()


def test_vllm_singleton_backend_and_plugin(monkeypatch):
    inst = compat_vllm.CuMemAllocator(memory=BufferMemory())
    monkeypatch.setattr(compat_vllm.CuMemAllocator, "instance", inst)
    assert compat_vllm.CuMemAllocator.get_instance() is inst
    with inst.use_memory_pool("weights"):
        w = Tensor(MiB, 0x66)
    (kv,) = vtags("kv")
    with inst.use_memory_pool(kv):
        k = Tensor(MiB, 0x77)
    backend = compat_vllm.SymmemSleepBackend()
    backend.suspend(level=1)
    assert backend.state() == "SUSPENDED"
    backend.resume()
    assert backend.state() == "RUNNING" and w.all(0x66) and k.all(0)
    backend.suspend(level=2)
    backend.resume(["weights"])
    assert w.all(0)
    backend.resume()
    monkeypatch.setitem(sys.modules, "vllm", None)  # no vLLM: the plugin does nothing
    assert compat_vllm.register() is False


def test_entry_point_is_declared():
    root = os.path.dirname(PYTHON_DIR)
    with open(os.path.join(root, "pyproject.toml")) as f:
        text = f.read()
    assert '[project.entry-points."vllm.general_plugins"]' in text
    assert 'symmem = "symmem.compat.vllm:register"' in text
    sys.path.insert(0, os.path.join(root, "buildsys"))
    try:
        import symmem_build
    finally:
        sys.path.pop(0)
    assert symmem_build.ENTRY_POINTS == "[vllm.general_plugins]\nsymmem = symmem.compat.vllm:register\n", "the wheel carries it"


# -- never stuck, errors of the originals' types ------------------------------


def reserved() -> int:
    return symmem.memory_stats(0)["reserved_bytes.all.current"]


@pytest.fixture
def no_limit():
    yield
    symmem.set_memory_limit(0, 0)


def test_a_failed_resume_leaves_each_tag_paused_or_live_and_a_retry_works(saver, no_limit):
    """Out of memory half-way through resume(T) (T is two libsymmem tags
    here): the first is live, the second paused, both said so; the same
    call works once there is room. The error is libsymmem's and a
    RuntimeError, as torch_memory_saver's failures are."""
    tag = unique("stuck")
    with saver.region(tag=tag):
        a = Tensor(4 * MiB, 1)
    with saver.region(tag=tag, enable_cpu_backup=True):
        b = Tensor(4 * MiB, 2)
    saver.pause(tag)
    symmem.empty_cache()
    first = symmem.tag_bytes("tms." + tag)[1]
    symmem.set_memory_limit(0, reserved() + first)
    for _ in range(2):
        with pytest.raises(symmem.OutOfMemoryError) as info:
            saver.resume(tag)
        assert isinstance(info.value, RuntimeError) and info.value.code == symmem.Result.OUT_OF_MEMORY
        assert saver.tag_states() == {"tms." + tag: "live", "tms." + tag + ".cpu": "paused"}
    symmem.set_memory_limit(0, 0)
    saver.resume(tag)
    assert b.all(2), "the paused part came back with its copy"
    assert saver.tag_states() == {"tms." + tag: "live", "tms." + tag + ".cpu": "live"}
    saver.pause(tag)
    saver.resume(tag)
    assert b.all(2)
    del a


def test_a_failed_pause_leaves_each_tag_paused_or_live_and_a_retry_works(saver, tmp_path):
    """A pause that fails half-way (the disk copy's directory vanished):
    the part paused before stays paused, the failed one live; pause(T)
    again pauses what is left, resume(T) takes everything back."""
    tag = unique("half")
    d = tmp_path / "backups"
    saver.set_disk_backup_dir(str(d))
    try:
        with saver.region(tag=tag):
            a = Tensor(MiB, 1)
        with saver.region(tag=tag, enable_disk_backup=True):
            b = Tensor(MiB, 2)
        d.rmdir()
        with pytest.raises(symmem.InvalidStateError) as info:
            saver.pause(tag)
        assert isinstance(info.value, RuntimeError)
        assert saver.tag_states() == {"tms." + tag: "paused", "tms." + tag + ".disk": "live"}
        assert b.all(2), "the failed part is untouched"
        d.mkdir()
        saver.pause(tag)
        assert saver.tag_states() == {"tms." + tag: "paused", "tms." + tag + ".disk": "paused"}
        with pytest.raises(symmem.InvalidStateError, match="already paused"):
            saver.pause(tag)
        saver.resume(tag)
        assert b.all(2)
    finally:
        symmem.set_backup_dir(None)
    del a


def test_errors_are_also_the_originals_types():
    import pickle

    from symmem.compat import original_error

    oom = original_error(symmem.OutOfMemoryError(symmem.Result.OUT_OF_MEMORY, "resuming: no room"))
    assert isinstance(oom, symmem.OutOfMemoryError) and isinstance(oom, RuntimeError) and isinstance(oom, MemoryError)
    assert oom.code == symmem.Result.OUT_OF_MEMORY and "no room" in str(oom)
    back = pickle.loads(pickle.dumps(oom))
    assert type(back) is type(oom) and back.message == oom.message
    for exc in (
        symmem.BackendError(symmem.Result.BACKEND, "driver"),
        symmem.TimeoutError(symmem.Result.TIMEOUT, "late"),
        symmem.PeerError(symmem.Result.PEER, "gone"),
    ):
        new = original_error(exc)
        assert isinstance(new, type(exc)) and isinstance(new, RuntimeError) and new.code == exc.code
    arg = symmem.InvalidArgumentError(symmem.Result.INVALID_ARGUMENT, "x")
    assert original_error(arg) is arg and isinstance(arg, ValueError)
    state = symmem.InvalidStateError(symmem.Result.INVALID_STATE, "x")
    assert original_error(state) is state and isinstance(state, RuntimeError)
    other = KeyError("k")
    assert original_error(other) is other


def test_drop_ins_resume_without_fill(saver, allocator, monkeypatch):
    """torch_memory_saver and vLLM leave memory without a copy undefined
    after a resume: the drop-ins ask for no fill (SYMMEM_RESUME_NO_FILL);
    symmem.resume keeps zero-filling by default."""
    calls = []
    real = symmem.tags.resume

    def spy(tag=None, group=None, zero=True, backup="keep"):
        calls.append((tag, zero, backup))
        return real(tag, group=group, zero=zero, backup=backup)

    monkeypatch.setattr(symmem.tags, "resume", spy)
    tag = unique("nf")
    with saver.region(tag=tag):
        Tensor(MiB, 1)
    saver.pause(tag)
    saver.resume(tag)
    (vt,) = vtags("nfv")
    with allocator.use_memory_pool(vt):
        Tensor(MiB, 1)
    allocator.sleep(offload_tags=())
    allocator.wake_up()
    assert calls == [("tms." + tag, False, "release"), ("vllm." + vt, False, "release")]
    with pytest.raises(ValueError, match="backup must be"):
        symmem.resume("tms." + tag, backup="sometimes")


def test_disable_gives_back_what_it_allocated(saver):
    """torch_memory_saver's training_engine: memory allocated and freed
    inside disable() is given back when the block exits."""
    tag = unique("dis")
    with saver.region(tag=tag):
        Tensor(MiB, 1)
        symmem.empty_cache()
        before = reserved()
        with saver.disable():
            p = symmem.alloc(32 * MiB)
            assert reserved() >= before + 32 * MiB
            symmem.free(p)
        assert reserved() <= before, "given back at the block's exit"


# -- vLLM's habits -------------------------------------------------------------


def test_vllm_worker_level_1_and_level_2_cycles(allocator):
    """vLLM's worker: weights and KV cache in their pools; level 1 offloads
    the weights and drops the KV cache, level 2 drops both (the worker
    reloads the weights); it wakes the weights first, then the KV cache.
    Host copies go back at wake_up, as vLLM frees its CPU tensors."""
    weights, kv = vtags("weights", "kv_cache")
    with allocator.use_memory_pool(tag=weights):
        w = Tensor(3 * MiB, 0x5A)
    with allocator.use_memory_pool(tag=kv):
        k = Tensor(6 * MiB, 0x6B)
    usage = allocator.get_current_usage()
    assert usage >= 9 * MiB
    for cycle in range(3):
        allocator.sleep(offload_tags=(weights,))  # level 1
        assert symmem.tag_bytes("vllm." + weights) == (0, symmem.tag_bytes("vllm." + weights)[1])
        allocator.wake_up(tags=[weights])
        assert w.all(0x5A), f"cycle {cycle}: the weights came back"
        assert symmem.tags.backup_state(w.ptr, 1)[0] is None, "the host copy went back at wake_up"
        assert symmem.tag_bytes("vllm." + kv)[0] == 0, "the KV cache sleeps until asked for"
        allocator.wake_up(tags=[kv])
        ctypes.memset(k.ptr, 0x6B, k.nbytes)  # the engine rebuilds its cache
        assert allocator.get_current_usage() == usage
    for cycle in range(2):
        allocator.sleep(offload_tags=())  # level 2
        allocator.wake_up(tags=[weights])
        ctypes.memset(w.ptr, 0x5A, w.nbytes)  # the worker reloads the weights
        allocator.wake_up(tags=[kv])
        assert allocator.get_current_usage() == usage
    assert w.all(0x5A)


def test_vllm_wake_up_without_room_is_a_runtime_error_and_retries(allocator, no_limit):
    weights, kv = vtags("weights", "kv_cache")
    with allocator.use_memory_pool(tag=weights):
        w = Tensor(4 * MiB, 0x21)
    with allocator.use_memory_pool(tag=kv):
        Tensor(4 * MiB, 0x22)
    allocator.sleep(offload_tags=(weights,))
    symmem.empty_cache()
    symmem.set_memory_limit(0, reserved() + MiB)
    try:
        allocator.wake_up()
    except RuntimeError as e:  # vLLM's callers catch RuntimeError
        assert isinstance(e, symmem.OutOfMemoryError) and e.code == symmem.Result.OUT_OF_MEMORY
    else:
        raise AssertionError("wake_up found room under the limit")
    symmem.set_memory_limit(0, 0)
    allocator.wake_up()
    assert w.all(0x21)
    allocator.sleep()
    allocator.wake_up()


# -- names and messages ------------------------------------------------------


# torch_memory_saver 0.0.10's public names, module by module.
TMS_NAMES = {
    "torch_memory_saver": ["TorchMemorySaver", "configure_subprocess", "torch_memory_saver"],
    "torch_memory_saver.entrypoint": ["TorchMemorySaver", "CpuBackupBackend"],
    "torch_memory_saver.utils": ["is_xpu", "get_binary_path_from_package", "change_env"],
    "torch_memory_saver.hooks.base": ["HookMode", "HookUtilBase"],
    "torch_memory_saver.hooks.mode_preload": ["HookUtilModePreload", "configure_subprocess"],
    "torch_memory_saver.hooks.mode_torch": ["HookUtilModeTorch"],
}
TMS_METHODS = [
    "region", "cuda_graph", "disable", "pause", "resume", "enabled", "hook_mode", "memory_margin_bytes",
    "retain_cpu_backup", "get_cpu_backup", "set_disk_backup_dir",
]


def test_every_public_name_of_torch_memory_saver_0_0_10():
    out = _run(
        f"""
        import sys, importlib
        sys.modules["torch"] = None  # these need no torch
        import symmem.compat
        symmem.compat.install()
        for mod, names in {TMS_NAMES!r}.items():
            m = importlib.import_module(mod)
            missing = [n for n in names if not hasattr(m, n)]
            assert not missing, (mod, missing)
        from torch_memory_saver import TorchMemorySaver
        missing = [n for n in {TMS_METHODS!r} if not hasattr(TorchMemorySaver, n)]
        assert not missing, missing
        from torch_memory_saver.utils import change_env, is_xpu
        assert is_xpu() is False
        import os
        with change_env("TMS_X_TEST", "1"):
            assert os.environ["TMS_X_TEST"] == "1"
        assert "TMS_X_TEST" not in os.environ
        print("ok")
        """
    )
    assert out.strip() == "ok"


def _run_failing(code: str):
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHON_DIR
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    return p.stderr


@pytest.mark.parametrize(
    "code, api",
    [
        (
            """
            import symmem.compat
            symmem.compat.install()
            from torch_memory_saver import torch_memory_saver
            with torch_memory_saver.region():
                pass
            """,
            "torch_memory_saver",
        ),
        (
            """
            from symmem.compat.vllm import CuMemAllocator
            CuMemAllocator.get_instance()
            """,
            "CuMemAllocator",
        ),
    ],
)
def test_without_torch_the_drop_ins_say_so_in_one_line(code, api):
    stderr = _run_failing('import sys\nsys.modules["torch"] = None\n' + textwrap.dedent(code))
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: ") and api in last and "needs PyTorch" in last and "install torch" in last, stderr
    assert "ModuleNotFoundError" not in stderr and "During handling" not in stderr, stderr
