"""Every C, Python and shell block of README.md runs as written: C blocks are
compiled against include/ and build/, Python blocks run with python/ on the
path; a block that reads RANK WORLD from its arguments runs as 2 processes.
Shell blocks (sh) run in a folder that looks like the checkout (include,
build and python linked) and holds every block whose first line names its
file (`/* app.c: ...`, `# app.py: ...`), so that the README's build line and
launch recipes are run exactly as a reader types them.
A block preceded by `<!-- readme-test: skip (why) -->` is not run (the why
is required). Host backend, a private socket directory.
The named programs also do what the README says beside them: app.c and
app.py print their usage when started without RANK WORLD, app.py runs
under torchrun's environment, and two launches at once with one group name
keep apart by their job tokens."""

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
    assert kinds.count("c") >= 1 and kinds.count("python") >= 1 and kinds.count("sh") >= 1, kinds
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


def checkout(where):
    """A folder laid out as the checkout's root (include, build and python
    linked), holding every block that names its file."""
    root = where / "checkout"
    root.mkdir(parents=True)
    for d in ("include", "build", "python"):
        (root / d).symlink_to(ROOT / d)
    for name, text in named_files().items():
        (root / name).write_text(text)
    return root


def run_shell(code, tmp_path, e):
    """A shell block, in a folder laid out as the checkout's root."""
    p = subprocess.run(["sh", "-ec", code], cwd=checkout(tmp_path), env=e, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=180)
    assert p.returncode == 0, f"the shell block exited {p.returncode}:\n{code}\n{p.stdout}"


def test_the_launch_recipes_name_their_files():
    files = named_files()
    assert {"app.c", "app.py"} <= set(files), sorted(files)
    shell = "\n".join(code for lang, code, why, _ in all_blocks() if lang == "sh" and why is None)
    assert "-Wl,-rpath" in shell and "./app" in shell and "python3 app.py" in shell, shell


def build_app_c(tmp_path):
    root = checkout(tmp_path)
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Werror", f"-I{ROOT / 'include'}", "app.c",
                    f"-L{ROOT / 'build'}", "-lsymmem", f"-Wl,-rpath,{ROOT / 'build'}", "-o", "app"], cwd=root, check=True)
    return root


@pytest.mark.parametrize("args", [[], ["0"], ["0", "2", "extra"]])
def test_app_c_without_its_arguments_prints_its_usage(args, tmp_path):
    root = build_app_c(tmp_path)
    p = subprocess.run([str(root / "app")] + args, env=env(tmp_path), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stderr.startswith("usage: ") and "RANK WORLD" in p.stderr, p.stderr


def test_app_py_without_its_arguments_prints_its_usage(tmp_path):
    root = checkout(tmp_path)
    e = env(tmp_path)
    for var in ("RANK", "WORLD_SIZE"):
        e.pop(var, None)
    p = subprocess.run([sys.executable, "app.py"], cwd=root, env=e, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stderr.startswith("usage: "), (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr


def test_app_py_runs_under_torchruns_environment(tmp_path):
    # What torchrun gives each process it starts (app.py needs no torch):
    # RANK, WORLD_SIZE and the run id that the library takes as job token.
    root = checkout(tmp_path)
    procs = []
    for r in range(2):
        e = env(tmp_path)
        e.update(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), TORCHELASTIC_RUN_ID="readme-run")
        procs.append(subprocess.Popen([sys.executable, "app.py"], cwd=root, env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out


def test_two_launches_at_once_do_not_join_each_other(tmp_path):
    # The README's build and launch lines for app.c, twice at the same time
    # (two checkouts, one socket directory, one group name): each launch's
    # own SYMMEM_JOB_TOKEN keeps its ranks together.
    shell = [code for lang, code, why, _ in all_blocks() if lang == "sh" and why is None and "./app" in code]
    assert len(shell) == 1, shell
    e = env(tmp_path)
    e.pop("SYMMEM_JOB_TOKEN", None)
    procs = [subprocess.Popen(["sh", "-ec", shell[0]], cwd=checkout(tmp_path / str(i)), env=e, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0, out
        assert sorted(l.split()[1] for l in out.splitlines() if l.startswith("rank ")) == ["0", "1", "2", "3"], out
