#!/usr/bin/env python3
"""Prints the one table that ends `make test`: a row per suite (from
build/results/*.tsv, written by scripts/run_suite.py) and the total, then
why tests were skipped (build/results/*.skips: each reason once per suite
with its count), then 'N passed, N failed, N skipped'. Exits 1 if any
suite failed."""
import glob
import os
import sys

rows = []
for path in sorted(glob.glob("build/results/*.tsv"), key=os.path.getmtime):
    with open(path) as f:
        name, p, fl, s, secs, rc = f.read().split("\t")
        rows.append((name, int(p), int(fl), int(s), float(secs), int(rc)))
expected = sys.argv[1:]
for name in expected:
    if name not in {r[0] for r in rows}:
        rows.append((name, 0, 1, 0, 0.0, -1))  # never ran
w = max([len("suite")] + [len(r[0]) for r in rows])
print()
print(f"{'suite':<{w}}  {'passed':>7}  {'failed':>7}  {'skipped':>7}  {'seconds':>8}")
print("-" * (w + 38))
for name, p, fl, s, secs, rc in rows:
    print(f"{name:<{w}}  {p:>7}  {fl:>7}  {s:>7}  {secs:>8.1f}" + ("" if rc == 0 else f"   exit {rc}"))
print("-" * (w + 38))
tp, tf, ts = (sum(r[i] for r in rows) for i in (1, 2, 3))
print(f"{'total':<{w}}  {tp:>7}  {tf:>7}  {ts:>7}")
# Why tests were skipped, per suite: the most frequent reasons first, at
# most MAX_REASONS per suite (the log has the rest).
MAX_REASONS = 6
skipped = [r for r in rows if r[3]]
if skipped:
    print()
    print("skipped, by reason:")
for name, p, fl, s, secs, rc in skipped:
    reasons = []
    try:
        with open(f"build/results/{name}.skips") as f:
            for line in f:
                n, _, why = line.rstrip("\n").partition("\t")
                reasons.append((int(n), why))
    except (OSError, ValueError):
        pass
    if not reasons:
        print(f"  {name}: {s} (no reason printed; see build/logs/{name}.log)")
        continue
    for n, why in reasons[:MAX_REASONS]:
        print(f"  {name}: {n} × {why}")
    if len(reasons) > MAX_REASONS:
        rest = sum(n for n, _ in reasons[MAX_REASONS:])
        print(f"  {name}: {rest} more, for {len(reasons) - MAX_REASONS} other reasons (build/logs/{name}.log)")
print(f"{tp} passed, {tf} failed, {ts} skipped")
sys.exit(1 if tf or any(r[5] != 0 for r in rows) else 0)
