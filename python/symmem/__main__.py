"""``python -m symmem``: what libsymmem finds here, then a self-test.
``python -m symmem build-torch-ops`` builds the collectives' operators' C++
kernels for the installed torch (symmem/_torch_ops.py says where).

Options: ``--json`` prints the report (and the self-test's results) as JSON;
``--no-self-test`` skips the self-test. The exit status is 0 when the library
loaded and every self-test step passed, 1 otherwise; when the reader of the
output goes away (``python -m symmem | head -3``) it stops quietly with 141,
as a program that SIGPIPE ends; when the output is closed or cannot be
written (``>&-``, ``> /dev/full``) it says so in one line on stderr and
exits with 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

from .info import format_text, info, self_test


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m symmem", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--no-self-test", action="store_true", help="skip the self-test")
    args = ap.parse_args(argv)
    rep = info()
    ok = "error" not in rep
    results = []
    if not args.json:
        _out(format_text(rep))
    if ok and not args.no_self_test:
        if not args.json:
            _out("self-test:")
        results = self_test()
        ok = all(r["ok"] for r in results)
        if not args.json:
            for r in results:
                _out(f"  {'PASS' if r['ok'] else 'FAIL'} {r['name']} ({r['seconds']} s): {r['detail']}")
            _out(f"self-test: {'PASS' if ok else 'FAIL'}")
    if args.json:
        rep["self_test"] = results
        rep["ok"] = ok
        _out(json.dumps(rep, indent=2))
    return 0 if ok else 1


class _OutputError(Exception):
    """Standard output cannot be written (other than a reader gone)."""


def _out(text: Optional[str]) -> None:
    """Print a line to stdout now (None: only flush); a failure to write it
    is an _OutputError (BrokenPipeError stays itself: the reader went away)."""
    if sys.stdout is None:  # started with stdout closed: Python has none
        raise _OutputError("standard output is closed")
    try:
        if text is None:
            sys.stdout.flush()
        else:
            print(text, flush=True)
    except BrokenPipeError:
        raise
    except OSError as e:
        raise _OutputError(f"cannot write to standard output: {e.strerror or e}") from None


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that Python's flush at exit cannot fail
    a second time on what is left in its buffer."""
    if sys.stdout is None:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def run(argv=None) -> int:
    """main, ending without a traceback whatever becomes of stdout: quietly
    with 141 when it is a pipe whose reader has gone, with one line on stderr
    and 1 when it is closed or refuses the report."""
    try:
        rc = main(argv)
        _out(None)  # a closed pipe shows here at the latest
        return rc
    except BrokenPipeError:
        _drop_stdout()
        return 141
    except _OutputError as e:
        _drop_stdout()
        if sys.stderr is not None:
            print(f"python -m symmem: {e}; the report was not printed", file=sys.stderr)
        return 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["build-torch-ops"]:
        from ._torch_ops import main as _build_torch_ops

        sys.exit(_build_torch_ops(sys.argv[2:]))
    sys.exit(run())
