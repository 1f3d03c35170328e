"""Python entry points check their arguments' types and say what they
expected (TypeError naming the parameter and "int"), rather than passing
them to ctypes or converting them silently."""

import uuid

import pytest

import symmem


@pytest.mark.parametrize("size", [4096.0, "4096", b"4096", None, [4096], True])
def test_alloc_size_must_be_an_int(size):
    with pytest.raises(TypeError, match=r"symmem\.alloc: size must be an int, not " + type(size).__name__):
        symmem.alloc(size)


def test_int_like_arguments_are_ints():
    class Index:
        def __index__(self):
            return 4096

    p = symmem.alloc(Index())
    assert symmem.pointer_info(p).requested_size == 4096
    symmem.free(p)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: symmem.alloc(64, device="0"), "device"),
        (lambda: symmem.free("0x1000"), "ptr"),
        (lambda: symmem.free(1 << 20, size=1.5), "size"),
        (lambda: symmem.empty(1.0), "nbytes"),
        (lambda: symmem.memory_stats("0"), "device"),
        (lambda: symmem.set_memory_limit(0, 1e9), "nbytes"),
        (lambda: symmem.copy(0, 0, 8.0), "nbytes"),
        (lambda: symmem.memset(0, 0.5, 8), "value"),
        (lambda: symmem.Group("g", "0", 1), "rank"),
        (lambda: symmem.Group("g", 0, 2.0), "world_size"),
    ],
)
def test_entry_points_say_which_int_they_expected(call, name):
    with pytest.raises(TypeError, match=f"{name} must be an int"):
        call()


def test_group_timeout_and_rendezvous_types():
    with pytest.raises(TypeError, match="timeout must be a number of seconds"):
        symmem.Group("g-" + uuid.uuid4().hex[:8], 0, 1, timeout="5")
    with symmem.Group("g-" + uuid.uuid4().hex[:8], 0, 1, timeout=10) as g:
        with pytest.raises(TypeError, match="expected a Buffer or an int address, not float"):
            symmem.rendezvous(4096.0, g)
        with pytest.raises(TypeError, match="expected a symmem.Group, not str"):
            symmem.rendezvous(0, "g")


@pytest.mark.parametrize("make", [
    lambda name: symmem.Group(name, 0, 1, timeout=5),
    lambda name: symmem.Group.from_nccl(0x1000, name),
])
def test_group_name_that_is_no_str_is_a_type_error(make):
    for name, shown in ((None, "NoneType None"), (42, "int 42"), (b"job", "bytes b'job'")):
        with pytest.raises(TypeError, match=f"name must be a str, not {shown}"):
            make(name)
    with pytest.raises(symmem.InvalidArgumentError, match='bad name "job 42"'):
        make("job 42")  # a str the library refuses stays InvalidArgumentError


def test_free_accepts_a_buffer():
    before = symmem.memory_stats(0)["allocation.all.current"]
    buf = symmem.empty(4096)
    assert symmem.memory_stats(0)["allocation.all.current"] == before + 1
    symmem.free(buf)
    assert buf.freed
    assert symmem.memory_stats(0)["allocation.all.current"] == before
    symmem.free(buf)  # freeing a freed Buffer again is what Buffer.free() does: nothing
