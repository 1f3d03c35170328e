"""Every C, Python and shell block of README.md runs as written: C blocks are
compiled against include/ and build/, Python blocks run with python/ on the
path; a block that reads RANK WORLD from its arguments runs as 2 processes.
Shell blocks (sh) run in a folder that looks like the checkout (include,
build and python linked) and holds every block whose first line names its
file (`/* app.c: ...`, `# app.py: ...`), so that the README's build line and
launch recipes are run exactly as a reader types them.
A block preceded by `<!-- readme-test: skip (why) -->` is not run (the why
is required). Host backend, a private socket directory."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"(<!-- readme-test: skip \(([^)]+)\) -->\n)?```(c|python|sh)\n(.*?)```", re.S)
# The first line of a block that names its file: /* app.c: ... */ or # app.py: ...
FILE_NAME = re.compile(r"^(?:/\*|#) ([\w.-]+\.(?:c|py)):")


def all_blocks():
    """(lang, code, why-not-run or None, line) of every fenced c/python/sh block."""
    text = (ROOT / "README.md").read_text()
    return [(m.group(3), m.group(4), m.group(2), text[: m.start()].count("\n") + 1) for m in FENCE.finditer(text)]


def blocks():
    return [pytest.param(lang, code, id=f"{lang}-line{line}") for lang, code, why, line in all_blocks() if why is None]


def env(tmp_path):
    e = dict(os.environ)
    e.update(SYMMEM_BACKEND="host", SYMMEM_SOCKET_DIR=str(tmp_path / "sock"), SYMMEM_ALLOW_OVERLAPPING_DEVICES="1",
             PYTHONPATH=str(ROOT / "python"), NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
             NVSHMEM_DISABLE_NVLS="1")
    os.makedirs(e["SYMMEM_SOCKET_DIR"], mode=0o700, exist_ok=True)
    return e


def run_ranks(cmd, ranked, e):
    runs = [cmd + [str(r), "2"] for r in range(2)] if ranked else [cmd]
    procs = [subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in runs]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, f"{' '.join(p.args)} exited {p.returncode}:\n{out}"


def test_readme_blocks_run_or_say_why_not():
    kinds = [lang for lang, _, why, _ in all_blocks() if why is None]
    assert kinds.count("c") >= 2 and kinds.count("python") >= 1, kinds
    for lang, _, why, line in all_blocks():
        assert why is None or len(why.split()) >= 3, f"line {line}: say why the block is not run"


@pytest.mark.parametrize("lang,code", blocks())
def test_readme_block_runs(lang, code, tmp_path):
    e = env(tmp_path)
    if lang == "c":
        src, exe = tmp_path / "snippet.c", tmp_path / "snippet"
        src.write_text(code)
        cc = os.environ.get("CC", "cc")
        subprocess.run([cc, "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Werror", f"-I{ROOT / 'include'}", str(src),
                        f"-L{ROOT / 'build'}", "-lsymmem", f"-Wl,-rpath,{ROOT / 'build'}", "-o", str(exe)], check=True)
        run_ranks([str(exe)], "argv[2]" in code, e)
    elif lang == "python":
        src = tmp_path / "snippet.py"
        src.write_text(code)
        run_ranks([sys.executable, str(src)], "sys.argv[2]" in code, e)
    else:
        run_shell(code, tmp_path, e)


def named_files():
    """{file name: code} of the blocks whose first line names their file."""
    out = {}
    for _, code, _, _ in all_blocks():
        m = FILE_NAME.match(code)
        if m:
            out[m.group(1)] = code
    return out


def run_shell(code, tmp_path, e):
    """A shell block, in a folder laid out as the checkout's root."""
    root = tmp_path / "checkout"
    root.mkdir()
    for d in ("include", "build", "python"):
        (root / d).symlink_to(ROOT / d)
    for name, text in named_files().items():
        (root / name).write_text(text)
    p = subprocess.run(["sh", "-ec", code], cwd=root, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=180)
    assert p.returncode == 0, f"the shell block exited {p.returncode}:\n{code}\n{p.stdout}"


def test_the_launch_recipes_name_their_files():
    files = named_files()
    assert {"app.c", "app.py"} <= set(files), sorted(files)
    shell = "\n".join(code for lang, code, why, _ in all_blocks() if lang == "sh" and why is None)
    assert "-Wl,-rpath" in shell and "./app" in shell and "python3 app.py" in shell, shell
