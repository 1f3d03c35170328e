"""``python -m symmem``: what libsymmem finds here, then a self-test.

Options: ``--json`` prints the report (and the self-test's results) as JSON;
``--no-self-test`` skips the self-test. The exit status is 0 when the library
loaded and every self-test step passed, 1 otherwise; when the reader of the
output goes away (``python -m symmem | head -3``) it stops quietly with 141,
as a program that SIGPIPE ends.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

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
        print(format_text(rep), flush=True)
    if ok and not args.no_self_test:
        if not args.json:
            print("self-test:", flush=True)
        results = self_test()
        ok = all(r["ok"] for r in results)
        if not args.json:
            for r in results:
                print(f"  {'PASS' if r['ok'] else 'FAIL'} {r['name']} ({r['seconds']} s): {r['detail']}")
            print(f"self-test: {'PASS' if ok else 'FAIL'}")
    if args.json:
        rep["self_test"] = results
        rep["ok"] = ok
        print(json.dumps(rep, indent=2))
    return 0 if ok else 1


def run(argv=None) -> int:
    """main, ending quietly when stdout is a pipe whose reader has gone."""
    try:
        rc = main(argv)
        sys.stdout.flush()  # a closed pipe shows here at the latest
        return rc
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that
        # this flush cannot raise a second time.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(run())
