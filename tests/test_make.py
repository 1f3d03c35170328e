"""The build's own tooling: `make gpu-artifacts` makes every library that
the tests and the GPU suite load from build/, `make test`'s summary says why
tests were skipped, and the toolchain check names the README's ways to a
new enough Go."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_artifacts_make_every_library_the_tests_load():
    # Every build/*.so named by the C tests, the Python tests and the GPU
    # suite (which runs where there is no Go: all of them come from here).
    wanted = set()
    for pattern in ("tests/c/*.c", "python/tests/*.py", "scripts/gpu_suite.sh"):
        for path in ROOT.glob(pattern):
            wanted |= set(re.findall(r"build/([A-Za-z0-9_./-]+\.so)\b", path.read_text()))
    assert "libcuda_fake.so" in wanted, wanted
    dry = subprocess.run(["make", "-n", "-B", "--no-print-directory", "gpu-artifacts"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    made = set(re.findall(r"build/([A-Za-z0-9_./-]+\.so)\b", dry))
    assert wanted <= made, f"make gpu-artifacts does not build {sorted(wanted - made)}"


def run_suite(tmp_path, name, kind, script):
    """scripts/run_suite.py on a made-up suite, in tmp_path (it writes
    build/results and build/logs under the working directory)."""
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "run_suite.py"), name, kind, "--", "sh", "-c", script],
                          cwd=tmp_path, capture_output=True, text=True)


def test_summary_says_why_tests_were_skipped(tmp_path):
    go_out = r"""=== RUN   TestA
    a_test.go:12: no GPU here
--- SKIP: TestA (0.00s)
=== RUN   TestB
=== RUN   TestB/sub
    b_test.go:3: no GPU here
--- PASS: TestB (0.00s)
    --- SKIP: TestB/sub (0.00s)
=== RUN   TestC
    c_test.go:9: needs a C compiler
--- SKIP: TestC (0.00s)
=== RUN   TestD
--- PASS: TestD (0.00s)
"""
    py_out = """..ss
SKIPPED [3] tests/test_torch_host.py:12: torch is not installed
SKIPPED [1] tests/test_x.py:40: no NVIDIA GPU
4 passed, 4 skipped in 1.00s
"""
    c_out = "[test_alloc] ok   one\n[test_alloc] skip stream test: host backend only\n1 passed, 0 failed\n"
    for name, kind, out in (("g", "go", go_out), ("p", "pytest", py_out), ("c", "c", c_out)):
        (tmp_path / f"{name}.txt").write_text(out)
        r = run_suite(tmp_path, name, kind, f"cat {name}.txt")
        assert r.returncode == 0, r.stdout + r.stderr
    s = subprocess.run([sys.executable, str(ROOT / "scripts" / "summary.py"), "g", "p", "c"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert s.returncode == 0, s.stdout
    text = s.stdout
    assert "skipped, by reason:" in text, text
    assert "g: 2 × no GPU here" in text and "g: 1 × needs a C compiler" in text, text
    assert "p: 3 × torch is not installed" in text and "p: 1 × no NVIDIA GPU" in text, text
    assert "c: 1 × stream test: host backend only" in text, text
    assert text.rstrip().endswith("7 passed, 0 failed, 8 skipped"), text


def test_a_go_suite_shows_a_tests_log_only_when_it_fails(tmp_path):
    # A passing test that exercised an error and a skipped test log what
    # reads like a failure; only the failing tests' logs are shown, before
    # their verdict; the skip reason still reaches the summary.
    go_out = """=== RUN   TestOpenMissingLibrary
    cuda_test.go:35: Open: cuda: cannot load the CUDA driver library (is the NVIDIA driver installed?)
--- PASS: TestOpenMissingLibrary (0.00s)
=== RUN   TestNeedsGPU
    backend_test.go:43: no CUDA: libcuda.so.1 not found
--- SKIP: TestNeedsGPU (0.00s)
=== RUN   TestBroken
    c_test.go:7: want 3, got 4
--- FAIL: TestBroken (0.00s)
=== RUN   TestParent
=== RUN   TestParent/sub
    d_test.go:9: the subtest's own failure
--- FAIL: TestParent (0.00s)
    --- FAIL: TestParent/sub (0.00s)
FAIL
FAIL	example.com/x	0.01s
"""
    (tmp_path / "g.txt").write_text(go_out)
    r = run_suite(tmp_path, "g", "go", "cat g.txt; exit 1")
    out = r.stdout
    assert r.returncode == 1, out
    assert "NVIDIA" not in out and "libcuda" not in out, out
    assert "--- SKIP: TestNeedsGPU" in out, out
    assert out.index("want 3, got 4") < out.index("--- FAIL: TestBroken"), out
    assert out.index("the subtest's own failure") < out.index("--- FAIL: TestParent "), out
    assert "1 passed, 3 failed, 1 skipped" in out and "FAIL\texample.com/x" in out, out
    assert "no CUDA: libcuda.so.1 not found" in (tmp_path / "build" / "results" / "g.skips").read_text()
    assert "is the NVIDIA driver installed?" in (tmp_path / "build" / "logs" / "g.log").read_text()


def test_a_c_suite_shows_skips_and_failures_not_passing_checks(tmp_path):
    c_out = """== build/tests/test_bad_input
[test_bad_input] ok   backend_notes() says why cuda was skipped (cuda backend unavailable: is the NVIDIA driver installed?)
[test_bad_input] skip stream test: host backend only
[test_bad_input] FAIL alloc returns NULL
[test_bad_input] 1 passed, 1 failed
"""
    (tmp_path / "c.txt").write_text(c_out)
    out = run_suite(tmp_path, "c", "c", "cat c.txt").stdout
    assert "NVIDIA" not in out, out
    assert "skip stream test" in out and "FAIL alloc returns NULL" in out and "== build/tests" in out, out


def test_a_suite_without_skips_prints_no_reasons(tmp_path):
    (tmp_path / "o.txt").write_text("3 passed in 0.10s\n")
    assert run_suite(tmp_path, "o", "pytest", "cat o.txt").returncode == 0
    s = subprocess.run([sys.executable, str(ROOT / "scripts" / "summary.py"), "o"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert "skipped, by reason" not in s.stdout, s.stdout


def test_toolchain_errors_give_the_readmes_ways_out(tmp_path):
    sys.path.insert(0, str(ROOT / "buildsys"))
    try:
        import symmem_build
    finally:
        sys.path.pop(0)
    fake = {}
    for v in ("go1.10", "go1.22.1"):
        f = tmp_path / v
        f.write_text(f"#!/bin/sh\necho {v}\n")
        f.chmod(0o755)
        fake[v] = str(f)
    for go, expect in (("/nonexistent/go", ("https://go.dev/dl/", "GOTOOLCHAIN=auto")),
                       (fake["go1.22.1"], ("GOTOOLCHAIN=auto", "https://go.dev/dl/")),
                       (fake["go1.10"], ("https://go.dev/dl/", "before 1.21"))):
        old = os.environ.get("GO")
        os.environ["GO"] = go
        try:
            symmem_build._check_toolchain()
        except symmem_build.BuildError as e:
            msg = str(e)
        else:
            raise AssertionError(f"GO={go} was accepted")
        finally:
            if old is None:
                os.environ.pop("GO")
            else:
                os.environ["GO"] = old
        assert "package manager" not in msg, msg
        for want in expect:
            assert want in msg, (go, msg)
