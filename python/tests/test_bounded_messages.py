"""10 KiB names, tags, paths and setting values through every call that takes
one: each comes back in the error quoted once, cut at 64 characters with its
length ("aaaa…" (10240 characters)), and no message reaches 1 KiB
(Note [Bounded messages] in core/quote.go)."""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys

import pytest

import symmem
from symmem import _lib
from symmem.errors import quote

LONG = 10240
MAX_MESSAGE = 1024


def check_message(msg: str, filler: str) -> None:
    short = msg if len(msg) < 2 * MAX_MESSAGE else msg[:MAX_MESSAGE] + "..."
    assert len(msg.encode()) < MAX_MESSAGE, short
    assert re.search(r'…" \((10240|10241|10247) characters\)', msg), short
    assert msg.count(filler * 50) == 1, short  # quoted once
    assert filler * 65 not in msg, short


def test_quote_follows_the_library_rule():
    assert quote("job-42") == '"job-42"'
    assert quote("a" * 64) == '"' + "a" * 64 + '"'
    assert quote("a" * 3000) == '"' + "a" * 64 + '…" (3000 characters)'
    assert quote('x"\n') == '"x\\"\\n"'


def test_long_group_name():
    name = "g" * LONG
    with pytest.raises(symmem.InvalidArgumentError) as e:
        symmem.Group(name, 0, 1, timeout=5)
    check_message(e.value.message, "g")
    assert "1 to 64 characters" in e.value.message


def test_long_group_name_with_allgather():
    with pytest.raises(symmem.InvalidArgumentError) as e:
        symmem.Group("h" * LONG, 0, 1, timeout=5, allgather=lambda rec: [rec])
    check_message(e.value.message, "h")


def test_long_group_name_over_nccl():
    # The name is checked before NCCL is looked for or the communicator used.
    with pytest.raises(symmem.InvalidArgumentError) as e:
        symmem.Group.from_nccl(0x1000, "n" * LONG)
    check_message(e.value.message, "n")


def c_message(rc):
    """The last error of a C call made here through ctypes."""
    assert rc == symmem.Result.INVALID_ARGUMENT, rc
    return _lib.lib().symmem_last_error_message().decode()


# The Python classes check names before the C calls do; the C API gets the
# same 10 KiB names here directly.
def test_long_names_through_the_c_api():
    lib = _lib.lib()
    out = _lib._group_p()
    check_message(c_message(lib.symmem_group_create(b"c" * LONG, 0, 1, 0, 5000, ctypes.byref(out))), "c")
    noop = _lib.ALLGATHER_FN(lambda send, recv, n, user: 0)
    check_message(c_message(lib.symmem_group_create_with_allgather(
        b"d" * LONG, 0, 1, 0, 5000, noop, None, ctypes.byref(out))), "d")
    check_message(c_message(lib.symmem_group_create_nccl(0x1000, b"e" * LONG, 5000, 0, ctypes.byref(out))), "e")
    for fn in (lib.symmem_pause, lib.symmem_resume):
        check_message(c_message(fn(b"f" * LONG)), "f")
    check_message(c_message(lib.symmem_region_begin(b"f" * LONG, 0)), "f")


def test_long_bad_name_quotes_it_once():
    with pytest.raises(symmem.InvalidArgumentError) as e:
        symmem.Group("b" * (LONG - 1) + "/", 0, 1, timeout=5)
    assert len(e.value.message) < MAX_MESSAGE and e.value.message.count("b" * 64) == 1, e.value.message


@pytest.mark.parametrize("call", ["region", "pause", "resume"])
def test_long_tags(call):
    tag = "t" * LONG
    with pytest.raises(symmem.InvalidArgumentError) as e:
        if call == "region":
            with symmem.region(tag):
                pass
        else:
            getattr(symmem, call)(tag)
    check_message(e.value.message, "t")


def test_long_tag_collective():
    with symmem.Group("bounded-tags", 0, 1, timeout=30) as g:
        for fn in (symmem.pause, symmem.resume):
            with pytest.raises(symmem.InvalidArgumentError) as e:
                fn("u" * LONG, group=g)
            check_message(e.value.message, "u")


# Settings and paths are read when the library starts: each case runs in a
# fresh process with the variable set and reports the failing call's message
# and the library's notes.
PROBE = r"""
import json, sys, symmem
out = {"notes": symmem.backend_notes()}
try:
    if sys.argv[1] == "group":
        symmem.Group("probe", 0, 1, timeout=5).destroy()
    elif sys.argv[1] == "nccl":
        symmem.nccl_version()
    else:
        symmem.free(symmem.alloc(4096))
    out["error"] = None
except Exception as exc:
    out["error"] = getattr(exc, "message", str(exc))
print(json.dumps(out))
"""


def probe(env_update, what="alloc"):
    env = dict(os.environ)
    env.update(env_update)
    p = subprocess.run([sys.executable, "-c", PROBE, what], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("var", ["SYMMEM_HEAP_RESERVE", "SYMMEM_THREAD_CACHE", "SYMMEM_TIMEOUT_MS", "SYMMEM_BARRIER"])
def test_long_setting_values(var):
    out = probe({var: "v" * LONG})
    assert out["error"], out
    check_message(out["error"], "v")
    line = [n for n in out["notes"].splitlines() if var in n]
    assert line, out["notes"]
    check_message(line[0], "v")


def test_long_setting_name():
    name = "SYMMEM_" + "N" * LONG
    out = probe({name: "1"})
    line = [n for n in out["notes"].splitlines() if "not a setting" in n]
    assert line, out["notes"]
    check_message(line[0], "N")


def test_long_backend_value():
    out = probe({"SYMMEM_BACKEND": "w" * LONG})
    assert out["error"], out
    check_message(out["error"], "w")


def test_long_socket_dir():
    out = probe({"SYMMEM_SOCKET_DIR": "/" + "s" * (LONG - 1)}, "group")
    assert out["error"], out
    check_message(out["error"], "s")


def test_long_machine_id():
    # Refused on the rank that has it, naming the setting (not by the peers
    # as a member record too long to read).
    out = probe({"SYMMEM_MACHINE_ID": "i" * LONG}, "group")
    assert out["error"], out
    check_message(out["error"], "i")
    assert "SYMMEM_MACHINE_ID=" in out["error"] and "longer than the 256 bytes allowed" in out["error"], out
    assert "malformed" not in out["error"], out


def test_long_driver_path():
    out = probe({"SYMMEM_BACKEND": "cuda", "SYMMEM_LIBCUDA": "/" + "c" * (LONG - 1)})
    assert out["error"], out
    check_message(out["error"], "c")


def test_long_nccl_path():
    out = probe({"SYMMEM_LIBNCCL": "/" + "l" * (LONG - 1)}, "nccl")
    assert out["error"], out
    check_message(out["error"], "l")


def test_long_library_path():
    env = dict(os.environ, SYMMEM_LIBRARY="/" + "y" * (LONG - 1))
    code = "import symmem\ntry:\n    symmem.version()\nexcept ImportError as e:\n    print(e)\n"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    msg = p.stdout.strip()
    assert "not found" in msg, (msg, p.stderr)
    check_message(msg, "y")


# Arguments of the wrong type or range: the message shows the value through
# symmem.errors.brief (a str quoted by the rule above, anything else cut at
# 64 characters with its length), never whole: symmem.alloc("x" * 10**6)
# once gave a 1 MB TypeError.
HUGE = 10**6


def _huge_cases():
    from symmem import compat, snapshot

    s = "x" * HUGE
    lst = list(range(10**5))
    return [
        ("alloc.size.str", lambda: symmem.alloc(s)),
        ("alloc.size.bytes", lambda: symmem.alloc(b"x" * HUGE)),
        ("alloc.device.str", lambda: symmem.alloc(64, device=s)),
        ("alloc.size.int", lambda: symmem.alloc(10**100000)),
        ("alloc.stream.list", lambda: symmem.alloc(64, stream=lst)),
        ("free.ptr.list", lambda: symmem.free(lst)),
        ("free.size.str", lambda: symmem.free(0x1000, size=s)),
        ("empty.nbytes.bytearray", lambda: symmem.empty(bytearray(HUGE))),
        ("memory_stats.device.str", lambda: symmem.memory_stats(s)),
        ("set_memory_limit.nbytes.list", lambda: symmem.set_memory_limit(0, lst)),
        ("copy.nbytes.str", lambda: symmem.copy(0, 0, s)),
        ("memset.value.dict", lambda: symmem.memset(0, dict.fromkeys(lst), 8)),
        ("pointer_info.ptr.tuple", lambda: symmem.pointer_info(tuple(lst))),
        ("Group.rank.str", lambda: symmem.Group("bounded-int", s, 1)),
        ("Group.timeout.str", lambda: symmem.Group("bounded-int", 0, 1, timeout=s)),
        ("Group.name.list", lambda: symmem.Group(lst, 0, 1)),
        ("rendezvous.group", lambda: symmem.rendezvous(0, s)),
        ("region.backup.str", lambda: symmem.region("t", backup=s).__enter__()),
        ("record_memory_history.enabled", lambda: snapshot.record_memory_history(enabled=s)),
        ("record_memory_history.context", lambda: snapshot.record_memory_history(context=lst)),
        ("record_memory_history.stacks", lambda: snapshot.record_memory_history(stacks=s)),
        ("record_memory_history.max_entries", lambda: snapshot.record_memory_history(max_entries=s)),
        ("compat.tag", lambda: compat._check_tag("api", "t" * HUGE, 40)),
    ]


@pytest.mark.parametrize("case", range(len(_huge_cases())), ids=[c[0] for c in _huge_cases()])
def test_wrong_arguments_give_bounded_messages(case):
    name, call = _huge_cases()[case]
    with pytest.raises((TypeError, ValueError, symmem.SymmemError)) as e:
        call()
    msg = str(e.value)
    assert len(msg.encode()) <= MAX_MESSAGE, (name, len(msg), msg[:200])
    assert "x" * 65 not in msg and "t" * 65 not in msg, msg
    if name.endswith(".str") or name.startswith(("record_memory_history.enabled", "record_memory_history.stacks")):
        assert f'…" ({HUGE} characters)' in msg, msg


def test_wrong_arguments_of_handles_give_bounded_messages():
    s = "x" * HUGE
    lst = list(range(10**5))
    with symmem.Group("bounded-handle", 0, 1, timeout=30) as g, symmem.empty(4096) as buf:
        with symmem.rendezvous(buf, g) as h:
            for call in (
                lambda: h.put_signal(s),
                lambda: h.wait_signal(0, channel=lst),
                lambda: h.barrier(channel=b"x" * HUGE),
                lambda: h.get_buffer(s),
                lambda: h.all_reduce(s),
                lambda: h.all_reduce("float32", op=s),
                lambda: h.all_reduce("float32", algo=lst),
                lambda: h.all_reduce("float32", count=s),
                lambda: h.all_gather("float32", out=10**100000),
                lambda: buf.read(s),
                lambda: buf.fill(lst),
            ):
                with pytest.raises((TypeError, ValueError, symmem.SymmemError)) as e:
                    call()
                msg = str(e.value)
                assert len(msg.encode()) <= MAX_MESSAGE, msg[:200]
                assert "x" * 65 not in msg, msg[:200]


def test_brief_follows_the_quote_rule():
    from symmem.errors import brief

    assert brief("job") == 'str "job"'
    assert brief("a" * 3000) == 'str "' + "a" * 64 + '…" (3000 characters)'
    assert brief(list(range(10**5))) == "list [0, 1, 2, 3, 4, 5, ...] (100000 items)"
    assert brief(4096.0) == "float 4096.0"
    assert brief(10**100000) == "int (an integer of 332193 bits)"
    assert len(brief(b"y" * HUGE)) < 200 and brief(b"y" * HUGE).endswith(f"({HUGE} bytes)")
