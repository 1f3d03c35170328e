"""What git tracks: sources and documents, never build outputs, and text that
speaks of what the code does, never of how or when the work on it went.

Both tests read `git ls-files`, so they see exactly what a clone gets."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def tracked():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


# Build outputs by name: wheels, shared objects (also versioned), objects,
# archives, Python bytecode, Go test binaries, compiled kernels, and anything
# under the folders that builds write.
BUILT_NAME = re.compile(
    r"(\.whl|\.so|\.so\.\d+(\.\d+)*|\.o|\.a|\.pyc|\.pyo|\.test|\.cubin|\.fatbin|\.egg)$"
    r"|(^|/)(build|dist|__pycache__|[^/]*\.egg-info)/"
)
# And by content: ELF executables and zip archives (a wheel by another name).
BUILT_MAGIC = (b"\x7fELF", b"PK\x03\x04")


def test_no_build_output_is_tracked():
    bad = []
    for p in tracked():
        path = ROOT / p
        if BUILT_NAME.search(p):
            bad.append(f"{p}: a build output by its name")
        elif path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                if f.read(4) in BUILT_MAGIC:
                    bad.append(f"{p}: a binary (ELF or zip)")
    assert not bad, "tracked build outputs (make builds them; see .gitignore):\n" + "\n".join(bad)


def test_build_output_patterns_match():
    for p in ["dist/symmem-0.1.0-py3-none-linux_x86_64.whl", "build/libsymmem.so.0", "x/y.o", "core/core.test",
              "python/symmem/libsymmem.so", "python/symmem/__pycache__/a.cpython-311.pyc"]:
        assert BUILT_NAME.search(p), p
    for p in ["docs/coll_bench.png", "cuda/testdata/fakecuda.c", "tests/c/env.sh", "buildsys/x.py"]:
        assert not BUILT_NAME.search(p), p


# Narration: text about how the work went rather than what the code does.
# Each pattern is written with a character class in its first word, so that
# this file does not contain the phrase it looks for.
NARRATION = [
    (r"(?<![\w\"'])[s]essions?\b(?![\w\"'])", "a work session"),
    (r"\b(was|were|is|are|been|be|not) [l]ent\b", "machines lent or not"),
    (r"\b[p]reviously\b", "what was before"),
    (r"\b(now|then) [f]ixed\b|\b[f]ixed now\b", "a fix in time"),
    (r"\b[u]sed to (be|start|sleep|take|go|run|make)\b", "what was before"),
    (r"\b(first|second|third|fourth|this|earlier|previous) [r]ound of (work|issues|changes)\b"
     r"|\b(first|second|third|fourth) [r]ound\b", "a round of work"),
    (r"(?<!pytorch )(?<!PyTorch )(?<!NCCL )\b[i]ssue \d+\b", "a project issue number"),
    (r"\b[h]as(n't| not)? landed\b|\b[h]ad not landed\b|\b[l]anded (first|on main)\b", "a merge"),
    (r"\bthe [l]ead('s)?\b", "who decided"),
    (r"\b(next|last|first) [G]PU run\b|\bafter the [G]PU run\b", "a run in time"),
    (r"\bno [d]evice time\b", "a run in time"),
    (r"[\d.]+ ?(ms|µs|us|ns|s|GB/s)? [b]efore\)", "a figure from before"),
]
TEXT = re.compile(r"(\.(go|c|h|cc|cu|cuh|py|md|sh|txt|toml|in|cmake|map)|(^|/)Makefile|^\.ci/run)$")


def narration_hits(text):
    """(line number, reason, line) for every narrating line of text."""
    hits = []
    compiled = [(re.compile(p, re.I), why) for p, why in NARRATION]
    for n, line in enumerate(text.splitlines(), 1):
        for rx, why in compiled:
            if rx.search(line):
                hits.append((n, why, line.strip()))
                break
    return hits


def test_tracked_text_does_not_narrate():
    me = Path(__file__).resolve().relative_to(ROOT).as_posix()
    bad = []
    for p in tracked():
        if p == me or not TEXT.search(p) or not (ROOT / p).is_file():
            continue
        text = (ROOT / p).read_text(errors="replace")
        bad += [f"{p}:{n}: {why}: {line[:120]}" for n, why, line in narration_hits(text)]
    assert not bad, "text that narrates how the work went instead of what the code does:\n" + "\n".join(bad)


@pytest.mark.parametrize("line", [
    "No 4-GPU machine was lent th" + "is session either.",
    "In the second " + "session (2026-11-22, two H200)",
    "the allocator " + "landed first",
    "group creation 8.6 ms (11.8 ms " + "before)",
    "the state point 13 of " + "issue 14 found",
])
def test_narration_patterns_catch(line):
    assert narration_hits(line), line


@pytest.mark.parametrize("line", [
    '@pytest.fixture(scope="session", autouse=True)',
    "proc = subprocess.Popen(cmd, start_new_session=True)",
    "which avoids pytorch issue 188567 (registration first)",
    "data was written before the flag was set",
    "the previous round's value",
])
def test_narration_patterns_spare(line):
    assert not narration_hits(line), line
