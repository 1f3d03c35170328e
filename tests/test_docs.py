"""The documents agree with the code wherever the code states the fact:

- the thread caches' largest block: every sentence of the header, the
  README, docs/ and the allocator benchmark that gives the thread caches (or
  their bins) a limit in MiB gives the constant of core/alloc and
  export/tcache.h;
- the settings: every SYMMEM_* variable that the code reads (the library
  through core/settings.go, the Python package, the tests, the scripts) has
  a row in docs/settings.md, and every row names a variable that
  core/settings.go knows and the code reads;
- links: every relative link of README.md and docs/*.md names a file that
  exists, and every #anchor a heading of that file; no text cites a
  DESIGN.md that the repository lacks.

docs/measurements.md records dated runs of earlier builds and keeps their
words; it is left out of the first check."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def tracked():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


def read(path):
    return (ROOT / path).read_text(errors="replace")


# ---------------------------------------------------------------------------
# The thread caches' largest block.

def cache_limit_mib():
    """MaxCachedBlock of core/alloc/threadcache.go in MiB, checked against
    SYMMEMI_TC_MAX_BLOCK of export/tcache.h (export/tcache.go also asserts
    at compile time that they agree)."""
    go = re.search(r"^const MaxCachedBlock = (\d+) << 20$", read("core/alloc/threadcache.go"), re.M)
    c = re.search(r"^#define SYMMEMI_TC_MAX_BLOCK \((\d+)u << 20\)", read("export/tcache.h"), re.M)
    assert go and c, "MaxCachedBlock or SYMMEMI_TC_MAX_BLOCK is no longer written as N << 20"
    assert go.group(1) == c.group(1), (go.group(1), c.group(1))
    return int(go.group(1))


CACHE = re.compile(r"thread(?:'s)? caches?|\bbins?\b", re.I)
LIMIT = re.compile(r"(?:up to|at most|over|above|beyond|>)\s*(\d+)\s*MiB")


def sentences(text):
    """The sentences of a Markdown page, a C header's comments or a C
    program's printf strings: comment markers and string seams removed,
    each paragraph joined, split after '.' and ';'."""
    lines = [re.sub(r"^\s*(?:/\*+|\*+/?|//+|#+)\s?", "", line) for line in text.splitlines()]
    flat = re.sub(r'\\n"\s*"|"\s*"', " ", "\n".join(lines))
    for para in re.split(r"\n\s*\n", flat):
        yield from re.split(r"(?<=[.;])\s+", " ".join(para.split()))


def cache_limits_stated(text):
    """(limit in MiB, sentence) for every sentence that gives the thread
    caches a limit."""
    return [(int(n), s) for s in sentences(text) if CACHE.search(s) for n in LIMIT.findall(s)]


CACHE_LIMIT_PLACES = ["include/symmem.h", "docs/design.md", "docs/speed.md", "docs/usage.md",
                      "bench/bench_alloc.c", "README.md"]


def test_the_thread_cache_limit_is_the_codes():
    mib = cache_limit_mib()
    pages = sorted(set(CACHE_LIMIT_PLACES) | {p for p in tracked() if p.startswith("docs/") and p.endswith(".md")}
                   - {"docs/measurements.md"})
    wrong, stated = [], set()
    for page in pages:
        for n, s in cache_limits_stated(read(page)):
            stated.add(page)
            if n != mib:
                wrong.append(f"{page}: {n} MiB where the code has {mib} MiB: {s[:160]}")
    assert not wrong, "\n".join(wrong)
    assert set(CACHE_LIMIT_PLACES) <= stated, f"no longer state the limit: {sorted(set(CACHE_LIMIT_PLACES) - stated)}"


@pytest.mark.parametrize("text,mib", [
    (" * Thread caches (SYMMEM_THREAD_CACHE, on by default): a block of at most\n * 10 MiB freed by a thread may"
     " be kept.", 10),
    ('"one served by the calling thread\'s cache\\n"\n         "(blocks up to 10 MiB; SYMMEM_THREAD_CACHE) makes'
     ' none.\\n"', 10),
    ("a *bin* of up to 32 blocks that the thread freed\n(untagged, at most 10 MiB, no recorded streams).", 10),
])
def test_a_stale_cache_limit_is_found(text, mib):
    assert [n for n, _ in cache_limits_stated(text)] == [mib]


def test_other_limits_are_not_taken_for_the_caches():
    text = ("Requests are rounded to 512 B; up to 1 MiB they are carved from 2 MiB\nsegments, up to 10 MiB from"
            " 20 MiB segments.\n\nWith NCCL 2.28.9 windows pay up to 4 MiB.")
    assert cache_limits_stated(text) == []


# ---------------------------------------------------------------------------
# Settings.

def setting_specs():
    """{name: reader} of settingSpecs in core/settings.go (reader "" for the
    library's own)."""
    text = read("core/settings.go")
    body = text[text.index("var settingSpecs = []settingSpec{"):]
    body = body[:body.index("\n}\n")]
    specs = {}
    for line in body.splitlines():
        m = re.search(r'\{name: "(SYMMEM_\w+)"', line)
        if m:
            r = re.search(r'reader: "(\w+)"', line)
            specs[m.group(1)] = r.group(1) if r else ""
    assert len(specs) > 20, specs
    return specs


# How code reads a variable: the settings parser's accessors and the Env*
# constants handed to it (Go), os.environ and ENV_* constants (Python),
# getenv (C), ${VAR} (shell).
READS = [
    (r"\.go$", re.compile(r'\.(?:Bool|Size|Duration|Text)\("(SYMMEM_\w+)"|\bEnv\w*\s*=\s*"(SYMMEM_\w+)"')),
    (r"\.py$", re.compile(r'environ(?:\.get|\.setdefault|\.pop)?\(\s*["\'](SYMMEM_\w+)|environ\[["\'](SYMMEM_\w+)["\']\]'
                          r'(?!\s*=[^=])|getenv\(["\'](SYMMEM_\w+)|\bENV_\w+\s*=\s*["\'](SYMMEM_\w+)')),
    (r"\.(c|h|cc)$", re.compile(r'getenv\("(SYMMEM_\w+)"\)')),
    (r"(\.sh|^\.ci/run|Makefile)$", re.compile(r"\$\{?(SYMMEM_\w+)")),
]


def reads():
    """{name: [files that read it]} over the tracked code."""
    found = {}
    for path in tracked():
        if path.startswith("docs/") or path.endswith(".md") or path == "tests/test_docs.py":
            continue
        for pattern, rx in READS:
            if re.search(pattern, path):
                for m in rx.finditer(read(path)):
                    found.setdefault(next(g for g in m.groups() if g), []).append(path)
    return found


def documented():
    return set(re.findall(r"^\| `(SYMMEM_\w+)` \|", read("docs/settings.md"), re.M))


# Variables that the Python package reads by itself, outside the library's
# parser (the library warns at load that such a name "is not a libsymmem
# setting"), with the page that documents them. A name here that becomes a
# setting of core/settings.go is held to the rule of every setting: a row in
# docs/settings.md. None today.
PYTHON_ONLY: dict = {}


def test_every_setting_the_code_reads_is_documented():
    specs, found, rows = setting_specs(), reads(), documented()
    assert "SYMMEM_TIMEOUT_MS" in found and "SYMMEM_LIBRARY" in found and "SYMMEM_LIBCUDA" in found, sorted(found)
    bad = []
    for name in sorted(set(found) | set(specs)):
        if name in rows:
            continue
        if name in PYTHON_ONLY and name not in specs:
            where = found.get(name, [])
            if not all(p.startswith("python/") for p in where):
                bad.append(f"{name}: read outside the Python package ({', '.join(where)}): make it a setting")
            elif f"`{name}" not in read(PYTHON_ONLY[name]):
                bad.append(f"{name}: read by the Python package, documented nowhere ({PYTHON_ONLY[name]})")
            continue
        bad.append(f"{name}: read by {', '.join(sorted(set(found.get(name, ['core/settings.go']))))}"
                   f" but has no row in docs/settings.md")
    for name in sorted(set(found) - set(specs) - set(PYTHON_ONLY)):
        bad.append(f"{name}: read by {', '.join(sorted(set(found[name])))} but not in settingSpecs"
                   f" (core/settings.go): the library would call it a typo")
    assert not bad, "\n".join(bad)


def test_every_documented_setting_is_read():
    specs, found, rows = setting_specs(), reads(), documented()
    code = {p: read(p) for p in tracked()
            if re.search(r"\.(go|py|c|h|cc|sh)$|^\.ci/run$|^Makefile$", p)
            and p not in ("core/settings.go", "core/settings_test.go", "tests/test_docs.py")}
    bad = []
    for name in sorted(rows):
        if name not in specs:
            bad.append(f"{name}: has a row in docs/settings.md but is not in settingSpecs (core/settings.go)")
        elif name not in found and not any(re.search(rf"\b{name}\b", text) for text in code.values()):
            bad.append(f"{name}: has a row in docs/settings.md but no code outside the parser names it")
    assert not bad, "\n".join(bad)


def test_the_read_patterns_see_each_language():
    samples = {
        "x.go": 'var on = core.Current().Bool("SYMMEM_A", true)\nconst EnvLibrary = "SYMMEM_B"\n',
        "x.py": 'os.environ.get("SYMMEM_C", "1")\nos.environ["SYMMEM_D"]\nos.environ["SYMMEM_W"] = "1"\n'
                'ENV_LIBRARY = "SYMMEM_E"\n',
        "x.c": 'const char *v = getenv("SYMMEM_F");\n',
        "x.sh": 'cache=${SYMMEM_G:-~/.cache}\n',
    }
    got = set()
    for path, text in samples.items():
        for pattern, rx in READS:
            if re.search(pattern, path):
                got |= {next(g for g in m.groups() if g) for m in rx.finditer(text)}
    assert got == {"SYMMEM_A", "SYMMEM_B", "SYMMEM_C", "SYMMEM_D", "SYMMEM_E", "SYMMEM_F", "SYMMEM_G"}, got


# ---------------------------------------------------------------------------
# Links.

def slug(heading):
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", read(path), re.M)}


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_relative_links_name_files_and_headings_that_exist():
    pages = ["README.md", "python/README.md"] + [p for p in tracked() if p.startswith("docs/") and p.endswith(".md")]
    bad = []
    for page in pages:
        for target in LINK.findall(read(page)):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (ROOT / page).parent / file if file else ROOT / page
            rel = dest.resolve().relative_to(ROOT).as_posix() if dest.resolve().is_relative_to(ROOT) else str(dest)
            if not dest.exists():
                bad.append(f"{page}: {target}: no file {rel}")
            elif anchor and rel.endswith(".md") and anchor not in anchors(rel):
                bad.append(f"{page}: {target}: no heading of {rel} has the anchor #{anchor}")
    assert not bad, "\n".join(bad)


def test_no_text_cites_a_design_md_the_repository_lacks():
    if (ROOT / "DESIGN.md").exists():
        return
    bad = [p for p in tracked() if p != "tests/test_docs.py" and re.search(r"\.(md|go|py|c|h)$", p)
           and re.search(r"(?<![\w/])DESIGN\.md", read(p))]
    assert not bad, f"cite DESIGN.md, which is not in the repository (docs/design.md is): {bad}"


def test_slugs_are_githubs():
    assert slug("Diagnostics: `python -m symmem`") == "diagnostics-python--m-symmem"
    assert slug("From C: signals, MPI, errors") == "from-c-signals-mpi-errors"
    assert slug("4. Small collectives") == "4-small-collectives"
