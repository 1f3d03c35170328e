"""The diagnostic: symmem.info(), python -m symmem (text and --json)."""

import json
import os
import subprocess
import sys

import symmem


def _run(*args, env_extra=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "symmem", *args], capture_output=True, text=True, env=env, timeout=120)


def test_info_reports_library_backend_settings():
    rep = symmem.info()
    assert rep["version"] == symmem.__version__
    assert rep["version_number"] == symmem.version()
    assert os.path.isabs(rep["library"]) and os.path.exists(rep["library"])
    assert rep["backend"]["name"] == symmem.backend_name()
    assert rep["backend"]["why"]
    assert len(rep["devices"]) == symmem.device_count()
    assert rep["devices"][0]["total_memory"] > 0
    for lib in ("nccl", "nvrtc"):
        assert lib in rep["libraries"]
    sd = rep["socket_dir"]
    assert sd["mode"] == "0700" and sd["owner_uid"] == os.getuid()
    names = {s["name"] for s in rep["settings"]}
    # read once, when the library started: what was set then (the test run's
    # SYMMEM_LIBRARY at least)
    assert "SYMMEM_LIBRARY" in names, names


def test_main_json_with_bad_settings_and_self_test():
    p = _run("--json", env_extra={"SYMMEM_HEAP_RESERVE": "1G", "SYMMEM_STRICT": "perhaps", "SYMMEM_TRACEE": "1"})
    rep = json.loads(p.stdout)
    by = {s["name"]: s for s in rep["settings"]}
    assert by["SYMMEM_HEAP_RESERVE"]["reading"] == "1073741824 bytes"
    assert "SYMMEM_STRICT" in by["SYMMEM_STRICT"]["error"]
    assert "did you mean SYMMEM_TRACE?" in by["SYMMEM_TRACEE"]["reading"]
    notes = "\n".join(rep["backend"]["notes"])
    assert 'SYMMEM_STRICT="perhaps"' in notes
    # An unreadable setting fails the first use: the self-test says so.
    assert rep["ok"] is False and p.returncode == 1
    assert "SYMMEM_STRICT" in rep["self_test"][0]["detail"]


def test_main_text_passes_self_test():
    p = _run()
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    for want in ("symmem package", "backend:", "devices:", "socket directory:", "settings", "self-test: PASS",
                 "PASS 2-process group, rendezvous, barrier"):
        assert want in out, out


def test_misspelt_backend_is_explained():
    p = _run("--json", "--no-self-test", env_extra={"SYMMEM_BACKEND": "gpu"})
    rep = json.loads(p.stdout)
    assert rep["backend"]["name"] == "none"
    assert 'SYMMEM_BACKEND="gpu" names no known backend' in "\n".join(rep["backend"]["notes"])


def test_free_finds_the_device_of_the_pointer():
    n = symmem.device_count()
    dev = n - 1  # device 1 under the fake driver (2 devices), 0 on host
    p = symmem.alloc(4096, device=dev)
    before = symmem.memory_stats(dev)["allocation.all.current"]
    symmem.free(p)  # no device given: the library knows it
    assert symmem.memory_stats(dev)["allocation.all.current"] == before - 1


def test_text_report_of_a_one_gpu_machine():
    """A report with JSON nulls where lists and maps are empty (one GPU: no
    peers) prints instead of failing; seen on an H100 machine."""
    from symmem.info import format_text

    rep = {
        "package": None,
        "backend": {"name": "cuda", "notes": None},
        "devices": None,
        "cuda_driver": {"version": "13.0", "devices": None, "peers": None},
        "libraries": {"nccl": {"found": False}},
        "socket_dir": None,
        "settings": None,
    }
    text = format_text(rep)
    assert "libraries:" in text and "nccl" in text


def test_text_report_on_the_host_backend_needs_no_gpu_libraries():
    """On the host backend, a missing driver, NCCL or NVRTC is not an error:
    the report says they are not needed there, with no install advice; on
    cuda the same report keeps the reasons."""
    from symmem.info import format_text

    missing = "cannot load NVRTC: not found. Install it: pip install nvidia-cuda-nvrtc"
    rep = {
        "backend": {"name": "host", "why": "automatic selection", "notes": []},
        "devices": [],
        "cuda_driver": {"error": "cuda: cannot load the CUDA driver library: libcuda.so.1 not found"},
        "libraries": {"nccl": {"found": False, "error": "cannot load NCCL"}, "nvrtc": {"found": False, "error": missing}},
    }
    text = format_text(rep)
    for what in ("cuda driver", "nccl", "nvrtc"):
        line = next(line for line in text.splitlines() if line.strip().startswith(what + ":"))
        assert "not needed for the host backend" in line, line
    assert "pip install" not in text and "cannot load" not in text, text
    rep["backend"]["name"] = "cuda"
    text = format_text(rep)
    assert "not needed" not in text and "pip install nvidia-cuda-nvrtc" in text, text


def test_a_misspelt_setting_warns_once_at_load():
    code = "import symmem; symmem.free(symmem.alloc(64))"
    env = dict(os.environ, SYMMEM_TIMEOUT="5000")
    env.pop("SYMMEM_QUIET", None)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = [line for line in p.stderr.splitlines() if "SYMMEM_TIMEOUT=" in line]
    assert len(lines) == 1 and "did you mean SYMMEM_TIMEOUT_MS?" in lines[0], p.stderr
    env["SYMMEM_QUIET"] = "1"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and "SYMMEM_TIMEOUT" not in p.stderr, p.stderr


def test_long_setting_name_and_value_give_bounded_lines():
    """A 100,000-character SYMMEM_* name and value (no setting) give one
    warning at load and one report line, each cut at 64 characters per echo
    (Note [Bounded messages]), and the self-test's ranks, which inherit
    them, still meet."""
    # One environment string holds at most 128 KiB: the long name has a
    # short value, the long value a short name.
    long_name, long_value = "SYMMEM_" + "N" * 100_000, "v" * 100_000
    env = {long_name: "1", "SYMMEM_TIMEOUT": long_value}
    env_clean = {k: v for k, v in os.environ.items() if k != "SYMMEM_QUIET"}
    env_clean.update(env)
    p = subprocess.run([sys.executable, "-m", "symmem"], capture_output=True, text=True, env=env_clean, timeout=120)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    warnings = [line for line in p.stderr.splitlines() if "is not a libsymmem setting" in line]
    assert len(warnings) == 2, p.stderr[:2000]
    report = [line for line in p.stdout.splitlines() if "NNNN" in line or "SYMMEM_TIMEOUT=" in line]
    assert len(report) == 4, p.stdout[:4000]  # the notes and the settings list each name both
    for line in p.stdout.splitlines() + p.stderr.splitlines():
        assert len(line.encode()) < 1024, line[:300]
        assert "N" * 65 not in line and "v" * 65 not in line, line[:300]
    assert sum("(100007 characters)=\"1\"" in line for line in warnings) == 1, warnings
    assert sum("SYMMEM_TIMEOUT=\"vvvv" in line and "(100000 characters)" in line for line in warnings) == 1, warnings
    assert "self-test: PASS" in p.stdout


def test_self_test_ranks_may_write_more_than_a_pipe_holds(monkeypatch):
    """The self-test's ranks write their output where nothing has to read it
    while they run: 256 KiB written before a rank joins does not keep the
    other rank waiting for it."""
    info = sys.modules["symmem.info"]  # the package's name "info" is the function

    monkeypatch.setattr(info, "_RANK_SCRIPT", "import sys; sys.stdout.write('x' * (256 << 10)); sys.stdout.flush()\n"
                        + info._RANK_SCRIPT)
    monkeypatch.setenv("SYMMEM_TIMEOUT_MS", "10000")
    results = info.self_test()
    assert [r["name"] for r in results] == ["allocate and free", "2-process group, rendezvous, barrier"]
    assert all(r["ok"] for r in results), results[-1]["detail"][-500:]
