"""Every integer argument of every entry point is checked against its C type
before ctypes sees it (symmem.errors.int_arg). ctypes keeps the low bits of
an int that does not fit: without the check, device=2**32 allocates on
device 0, rank 2**32 is rank 0 and channel 2**40 is channel 0.

An int outside its C type's range raises InvalidArgumentError (a
ValueError) naming the call, the argument, the value and the range, an
allocation's size above size_t too (a size that fits but is too large is
OutOfMemoryError)."""

from __future__ import annotations

import uuid

import pytest

import symmem
from symmem import snapshot
from symmem.errors import C_INT, C_PTR, C_SIZE, C_UINT, C_INT64, int_arg

INT_OVER = 2**32  # device 0, rank 0, channel 0 once truncated to int
INT_UNDER = -(2**31) - 1
SIZE_OVER = 2**64
PTR_OVER = 2**64 + 0x1000


@pytest.fixture(scope="module")
def group():
    with symmem.Group("ranges-" + uuid.uuid4().hex[:8], 0, 1, timeout=30) as g:
        yield g


@pytest.fixture(scope="module")
def handle(group):
    buf = symmem.empty(4096)
    with symmem.rendezvous(buf, group) as h:
        yield h
    buf.free()


@pytest.fixture
def ptr():
    p = symmem.alloc(4096)
    yield p
    symmem.free(p)


@pytest.fixture
def buf():
    with symmem.empty(4096) as b:
        yield b


def range_text(ctype):
    return f"[{ctype.lo}, {ctype.hi}]"


# (id, call, argument name, value, C type). The call receives the fixtures
# it names: ptr, buf, group, handle.
CASES = [
    # the allocator
    ("alloc.device", lambda: symmem.alloc(4096, device=INT_OVER), "device", INT_OVER, C_INT),
    ("alloc.device.low", lambda: symmem.alloc(4096, device=INT_UNDER), "device", INT_UNDER, C_INT),
    ("alloc.size", lambda: symmem.alloc(-1), "size", -1, C_SIZE),
    ("alloc.stream", lambda: symmem.alloc(64, stream=PTR_OVER), "stream", PTR_OVER, C_PTR),
    ("free.ptr", lambda: symmem.free(PTR_OVER), "ptr", PTR_OVER, C_PTR),
    ("free.ptr.negative", lambda: symmem.free(-4096), "ptr", -4096, C_PTR),
    ("free.size", lambda ptr: symmem.free(ptr, size=SIZE_OVER + 4096), "size", SIZE_OVER + 4096, C_SIZE),
    ("free.device", lambda ptr: symmem.free(ptr, 4096, device=INT_OVER), "device", INT_OVER, C_INT),
    ("free.stream", lambda ptr: symmem.free(ptr, 4096, 0, stream=-1), "stream", -1, C_PTR),
    ("record_stream.ptr", lambda: symmem.record_stream(PTR_OVER, 0), "ptr", PTR_OVER, C_PTR),
    ("record_stream.stream", lambda ptr: symmem.record_stream(ptr, PTR_OVER), "stream", PTR_OVER, C_PTR),
    ("empty_cache.device", lambda: symmem.empty_cache(INT_OVER), "device", INT_OVER, C_INT),
    ("thread_caches_drain.device", lambda: symmem.thread_caches_drain(INT_OVER), "device", INT_OVER, C_INT),
    ("set_memory_limit.device", lambda: symmem.set_memory_limit(INT_OVER, 0), "device", INT_OVER, C_INT),
    ("set_memory_limit.nbytes", lambda: symmem.set_memory_limit(0, SIZE_OVER), "nbytes", SIZE_OVER, C_SIZE),
    ("set_memory_limit.negative", lambda: symmem.set_memory_limit(0, -1), "nbytes", -1, C_SIZE),
    ("get_memory_limit.device", lambda: symmem.get_memory_limit(INT_OVER), "device", INT_OVER, C_INT),
    ("set_memory_fraction.device", lambda: symmem.set_memory_fraction(0.5, INT_OVER), "device", INT_OVER, C_INT),
    ("memory_stats.device", lambda: symmem.memory_stats(INT_OVER), "device", INT_OVER, C_INT),
    ("reset_peak_memory_stats.device", lambda: symmem.reset_peak_memory_stats(INT_OVER), "device", INT_OVER, C_INT),
    ("pointer_info.ptr", lambda: symmem.pointer_info(-1), "ptr", -1, C_PTR),
    ("copy.dst", lambda ptr: symmem.copy(PTR_OVER, ptr, 8), "dst", PTR_OVER, C_PTR),
    ("copy.src", lambda ptr: symmem.copy(ptr, PTR_OVER, 8), "src", PTR_OVER, C_PTR),
    ("copy.nbytes", lambda ptr: symmem.copy(ptr, ptr, SIZE_OVER + 8), "nbytes", SIZE_OVER + 8, C_SIZE),
    ("copy.device", lambda ptr: symmem.copy(ptr, ptr, 8, device=INT_OVER), "device", INT_OVER, C_INT),
    ("copy.stream", lambda ptr: symmem.copy(ptr, ptr, 8, 0, stream=PTR_OVER), "stream", PTR_OVER, C_PTR),
    ("memset.dst", lambda: symmem.memset(PTR_OVER, 0, 8), "dst", PTR_OVER, C_PTR),
    ("memset.value", lambda ptr: symmem.memset(ptr, INT_OVER, 8), "value", INT_OVER, C_INT),
    ("memset.nbytes", lambda ptr: symmem.memset(ptr, 0, SIZE_OVER), "nbytes", SIZE_OVER, C_SIZE),
    ("memset.device", lambda ptr: symmem.memset(ptr, 0, 8, INT_OVER), "device", INT_OVER, C_INT),
    ("validate.device", lambda: symmem.validate(INT_OVER), "device", INT_OVER, C_INT),
    ("strerror.code", lambda: symmem.strerror(INT_OVER + 1), "code", INT_OVER + 1, C_INT),
    ("collectives_load.device", lambda: symmem.collectives_load(INT_OVER), "device", INT_OVER, C_INT),
    # buffers
    ("empty.device", lambda: symmem.empty(4096, device=INT_OVER), "device", INT_OVER, C_INT),
    ("empty.nbytes", lambda: symmem.empty(-4096), "nbytes", -4096, C_SIZE),
    ("empty.stream", lambda: symmem.empty(4096, stream=PTR_OVER), "stream", PTR_OVER, C_PTR),
    ("Buffer.ptr", lambda: symmem.Buffer(PTR_OVER, 8), "ptr", PTR_OVER, C_PTR),
    ("Buffer.nbytes", lambda: symmem.Buffer(0x1000, -8), "nbytes", -8, C_SIZE),
    ("Buffer.device", lambda: symmem.Buffer(0x1000, 8, INT_OVER), "device", INT_OVER, C_INT),
    ("Buffer.read.offset", lambda buf: buf.read(SIZE_OVER), "offset", SIZE_OVER, C_SIZE),
    ("Buffer.read.nbytes", lambda buf: buf.read(0, -1), "nbytes", -1, C_SIZE),
    ("Buffer.write.offset", lambda buf: buf.write(b"x", -SIZE_OVER), "offset", -SIZE_OVER, C_SIZE),
    ("Buffer.fill.value", lambda buf: buf.fill(INT_OVER), "value", INT_OVER, C_INT),
    ("Buffer.fill.offset", lambda buf: buf.fill(0, -1), "offset", -1, C_SIZE),
    # tags
    ("backup_pointer.ptr", lambda: symmem.backup_pointer(PTR_OVER, 8), "ptr", PTR_OVER, C_PTR),
    ("backup_pointer.size", lambda ptr: symmem.backup_pointer(ptr, SIZE_OVER), "size", SIZE_OVER, C_SIZE),
    ("backup_state.size", lambda ptr: symmem.tags.backup_state(ptr, -1), "size", -1, C_SIZE),
    # snapshots
    ("record_memory_history.max_entries",
     lambda: snapshot.record_memory_history(max_entries=SIZE_OVER), "max_entries", SIZE_OVER, C_SIZE),
    # groups
    ("Group.rank", lambda: symmem.Group("ranges-r", INT_OVER, 1), "rank", INT_OVER, C_INT),
    ("Group.world_size", lambda: symmem.Group("ranges-w", 0, INT_OVER + 1), "world_size", INT_OVER + 1, C_INT),
    ("Group.device", lambda: symmem.Group("ranges-d", 0, 1, device=INT_OVER), "device", INT_OVER, C_INT),
    ("Group.from_nccl.comm", lambda: symmem.Group.from_nccl(PTR_OVER, "ranges-n"), "comm", PTR_OVER, C_PTR),
    ("Group.is_local.rank", lambda group: group.is_local(INT_OVER), "rank", INT_OVER, C_INT),
    ("Group.machine.rank", lambda group: group.machine(INT_OVER), "rank", INT_OVER, C_INT),
    ("Group.set_signal_pad_size.nbytes",
     lambda group: group.set_signal_pad_size(SIZE_OVER), "nbytes", SIZE_OVER, C_SIZE),
    ("rendezvous.ptr", lambda group: symmem.rendezvous(PTR_OVER, group), "ptr", PTR_OVER, C_PTR),
    # handles
    ("Handle.get_buffer.rank", lambda handle: handle.get_buffer(INT_OVER), "rank", INT_OVER, C_INT),
    ("Handle.get_buffer.nbytes", lambda handle: handle.get_buffer(0, SIZE_OVER), "nbytes", SIZE_OVER, C_SIZE),
    ("Handle.get_buffer.offset", lambda handle: handle.get_buffer(0, 8, -1), "offset", -1, C_SIZE),
    ("Handle.get_signal_pad.rank", lambda handle: handle.get_signal_pad(INT_OVER), "rank", INT_OVER, C_INT),
    ("Handle.put_signal.dst_rank", lambda handle: handle.put_signal(INT_OVER), "dst_rank", INT_OVER, C_INT),
    ("Handle.put_signal.channel", lambda handle: handle.put_signal(0, channel=2**33), "channel", 2**33, C_INT),
    ("Handle.put_signal.stream", lambda handle: handle.put_signal(0, 0, PTR_OVER), "stream", PTR_OVER, C_PTR),
    ("Handle.wait_signal.src_rank", lambda handle: handle.wait_signal(INT_OVER), "src_rank", INT_OVER, C_INT),
    ("Handle.wait_signal.channel",
     lambda handle: handle.wait_signal(0, channel=2**40, timeout=1), "channel", 2**40, C_INT),
    ("Handle.barrier.channel", lambda handle: handle.barrier(channel=2**40, timeout=1), "channel", 2**40, C_INT),
    ("Handle.barrier.stream", lambda handle: handle.barrier(0, 1, stream=-1), "stream", -1, C_PTR),
    ("Handle.all_reduce.count",
     lambda handle: handle.all_reduce("float32", count=SIZE_OVER), "count", SIZE_OVER, C_SIZE),
    ("Handle.all_reduce.channel",
     lambda handle: handle.all_reduce("float32", channel=INT_OVER), "channel", INT_OVER, C_INT),
    ("Handle.all_reduce.out", lambda handle: handle.all_reduce("float32", out=PTR_OVER), "out", PTR_OVER, C_PTR),
    ("Handle.all_gather.channel",
     lambda handle: handle.all_gather("float32", channel=INT_OVER), "channel", INT_OVER, C_INT),
    ("Handle.reduce_scatter.count",
     lambda handle: handle.reduce_scatter("float32", count=-1), "count", -1, C_SIZE),
]


@pytest.mark.parametrize("call, name, value, ctype", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_out_of_range(request, call, name, value, ctype):
    args = [request.getfixturevalue(p) for p in call.__code__.co_varnames[: call.__code__.co_argcount]]
    with pytest.raises(symmem.InvalidArgumentError) as e:
        call(*args)
    msg = e.value.message
    assert f"{name} {value} is out of range for its C type {ctype.name} {range_text(ctype)}" in msg, msg
    call_name = msg.split(":")[0]  # the message names the call first
    assert call_name and " " not in call_name, msg


def test_every_entry_point_has_a_case():
    """The public functions and methods taking ints each appear above."""
    named = {c[0].split(".")[0] if not c[0].startswith(("Group.", "Handle.", "Buffer.")) else ".".join(c[0].split(".")[:2])
             for c in CASES}
    expected = {
        "alloc", "free", "record_stream", "empty_cache", "thread_caches_drain", "set_memory_limit",
        "get_memory_limit", "set_memory_fraction", "memory_stats", "reset_peak_memory_stats", "pointer_info",
        "copy", "memset", "validate", "strerror", "collectives_load", "empty", "Buffer.ptr", "Buffer.nbytes",
        "Buffer.device", "Buffer.read", "Buffer.write", "Buffer.fill", "backup_pointer", "backup_state",
        "record_memory_history", "Group.rank", "Group.world_size", "Group.device", "Group.from_nccl",
        "Group.is_local", "Group.machine", "Group.set_signal_pad_size", "rendezvous", "Handle.get_buffer",
        "Handle.get_signal_pad", "Handle.put_signal", "Handle.wait_signal", "Handle.barrier",
        "Handle.all_reduce", "Handle.all_gather", "Handle.reduce_scatter",
    }
    assert expected <= named, expected - named


def test_alloc_beyond_size_t_is_invalid_argument():
    for call in (symmem.alloc, symmem.empty):
        for size in (SIZE_OVER, SIZE_OVER + 5, 2**70):
            with pytest.raises(symmem.InvalidArgumentError) as e:
                call(size)
            assert not isinstance(e.value, MemoryError), (call, size)
            assert f" {size} is out of range for its C type size_t" in e.value.message


def test_the_edges_of_each_range_pass_the_check():
    for ctype in (C_INT, C_UINT, C_INT64, C_SIZE, C_PTR):
        assert int_arg(ctype.lo, "x", "t", ctype) == ctype.lo
        assert int_arg(ctype.hi, "x", "t", ctype) == ctype.hi
        for bad in (ctype.lo - 1, ctype.hi + 1):
            with pytest.raises(symmem.InvalidArgumentError, match=f"t: x {bad} is out of range"):
                int_arg(bad, "x", "t", ctype)
    # The largest int is the C library's to judge: a device past the last.
    with pytest.raises(symmem.InvalidDeviceError):
        symmem.alloc(64, device=C_INT.hi)


def test_index_types_are_checked_after_conversion():
    class Big:
        def __index__(self):
            return 2**32

    with pytest.raises(symmem.InvalidArgumentError, match="device 4294967296 is out of range"):
        symmem.alloc(64, device=Big())


def test_huge_ints_are_named_by_their_size():
    with pytest.raises(symmem.InvalidArgumentError) as e:
        symmem.alloc(64, device=10**100000)
    assert "device (an integer of 332193 bits) is out of range" in e.value.message
    assert len(e.value.message) < 1024


def test_in_range_values_still_work(handle):
    # channel 1 is a valid channel: a put and a wait on it pass.
    handle.put_signal(0, channel=1)
    handle.wait_signal(0, channel=1, timeout=5)
    handle.barrier(channel=2, timeout=5)
