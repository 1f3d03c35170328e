#!/usr/bin/env python3
"""Runs one test suite for `make test`: its whole output goes to a log file,
the lines worth seeing go to the terminal, a line is printed at least every
10 s while it runs, and its counts (passed, failed, skipped) and time are
written to build/results/NAME.tsv for scripts/summary.py's table, with
the reasons given for skipped tests in build/results/NAME.skips.

    run_suite.py NAME KIND -- COMMAND...

KIND says how to count and what to show: go (go test -v; a test's log
lines are shown only when it fails), pytest (pytest -q -rs), c (the C
tests' check.h lines, "N passed, M failed" and "skip"), plain (everything
shown; counted from "N passed, M failed" lines, else by the exit status
alone).
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

HEARTBEAT_S = 10.0
# A suite still running after this long is killed and counted as failed, so
# that a hang shows as a row of the table, not as a make that never ends.
SUITE_TIMEOUT_S = float(os.environ.get("SUITE_TIMEOUT_S", "900"))


def shown(kind: str, line: str) -> bool:
    if kind == "go":
        return bool(re.match(r"^(ok |FAIL|--- FAIL|panic|--- SKIP|\s+--- FAIL|# |\S+\.go:\d+)", line)) or "DATA RACE" in line
    if kind == "c":
        return bool(re.search(r"FAIL|\d+ passed, \d+ failed|^== |\bskip\b|ERROR|Sanitizer", line))
    return True


class GoShown:
    """What the terminal shows of `go test -v`: results, failures, panics,
    races and build errors, and a test's log lines (`    x_test.go:12: ...`)
    only when that test, or the test it belongs to, fails. Passing and
    skipped tests log the errors they exercise on purpose and the reasons
    they skip ("is the NVIDIA driver installed?"), which on the terminal
    read like failures; they stay in the log file, and the summary counts
    the skip reasons."""

    LOG = re.compile(r"^\s+\S+\.go:\d+: ")

    def __init__(self) -> None:
        self.current = ""
        self.held = {}  # test name -> its log lines, not shown yet

    def feed(self, line: str):
        """The lines to show now, given the next line of output."""
        m = re.match(r"^=== (?:RUN|CONT|NAME|PAUSE)\s+(\S+)", line)
        if m:
            self.current = m.group(1)
            return []
        if self.current and self.LOG.match(line):
            self.held.setdefault(self.current, []).append(line)
            return []
        m = re.match(r"^\s*--- (PASS|FAIL|SKIP): (\S+)", line)
        if m:
            verdict, name = m.groups()
            logs = []
            for test in [n for n in self.held if n == name or n.startswith(name + "/")]:
                logs += self.held.pop(test)
            return logs + [line] if verdict == "FAIL" else ([line] if verdict == "SKIP" else [])
        return [line] if shown("go", line) else []


def count(kind: str, lines):
    p = f = s = 0
    if kind == "go":
        for l in lines:
            m = re.match(r"^\s*--- (PASS|FAIL|SKIP):", l)
            if m:
                p += m.group(1) == "PASS"
                f += m.group(1) == "FAIL"
                s += m.group(1) == "SKIP"
    elif kind == "pytest":
        for l in lines:
            if re.search(r"\d+ (passed|failed|skipped|error)", l) and (" in " in l):
                for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?)", l):
                    if what == "passed":
                        p += int(n)
                    elif what == "skipped":
                        s += int(n)
                    else:
                        f += int(n)
    elif kind in ("c", "plain"):
        for l in lines:
            m = re.search(r"(\d+) passed, (\d+) failed", l)
            if m:
                p += int(m.group(1))
                f += int(m.group(2))
            if re.search(r"\bskip\b", l):
                s += 1
    return p, f, s


def skip_reasons(kind: str, lines):
    """Why tests were skipped: [(count, reason)], one entry per distinct
    reason, from go test -v's last log line of the skipped test, pytest -rs's
    "SKIPPED [n] file:line: reason" and check.h's "skip reason" lines;
    file:line prefixes are dropped so that one reason given by several tests
    is counted once."""
    found = {}

    def add(reason: str, n: int = 1) -> None:
        reason = re.sub(r"\s+", " ", reason).strip() or "(no reason given)"
        if len(reason) > 160:
            reason = reason[:160] + "…"
        found[reason] = found.get(reason, 0) + n

    if kind == "go":
        # go test -v prints a test's t.Skip message (its last log line) under
        # "=== RUN/CONT/NAME <test>" before "--- SKIP: <test>".
        current, last_log = "", {}
        for l in lines:
            m = re.match(r"^=== (?:RUN|CONT|NAME)\s+(\S+)", l)
            if m:
                current = m.group(1)
                continue
            m = re.match(r"^\s+\S+\.go:\d+: (.*)", l)
            if m and current:
                last_log[current] = m.group(1)
                continue
            m = re.match(r"^\s*--- SKIP: (\S+)", l)
            if m:
                add(last_log.get(m.group(1), m.group(1) + " (no reason printed)"))
    elif kind == "pytest":
        for l in lines:
            m = re.match(r"^SKIPPED \[(\d+)\] (?:\S+?:\d+: )?(.*)", l)
            if m:
                add(m.group(2), int(m.group(1)))
    else:
        for l in lines:
            m = re.search(r"\bskip\b:? ?(.*)", l)
            if m:
                add(m.group(1))
    return sorted(((n, r) for r, n in found.items()), key=lambda x: (-x[0], x[1]))


def main() -> int:
    name, kind = sys.argv[1], sys.argv[2]
    assert sys.argv[3] == "--"
    cmd = sys.argv[4:]
    os.makedirs("build/results", exist_ok=True)
    os.makedirs("build/logs", exist_ok=True)
    log_path = f"build/logs/{name}.log"
    start = time.monotonic()
    last = [start]
    lock = threading.Lock()
    done = threading.Event()

    def say(msg: str) -> None:
        with lock:
            print(f"[{name}] {msg}", flush=True)
            last[0] = time.monotonic()

    timed_out = threading.Event()
    procs = []

    def beat() -> None:
        while not done.wait(1.0):
            now = time.monotonic()
            if now - last[0] >= HEARTBEAT_S:
                say(f"... running, {now - start:.0f} s (log: {log_path})")
            if now - start > SUITE_TIMEOUT_S and procs and not timed_out.is_set():
                timed_out.set()
                say(f"TIMED OUT after {SUITE_TIMEOUT_S:.0f} s (SUITE_TIMEOUT_S): killing it")
                try:
                    os.killpg(procs[0].pid, signal.SIGKILL)
                except OSError:
                    pass

    say("start: " + " ".join(cmd))
    threading.Thread(target=beat, daemon=True).start()
    lines = []
    go_shown = GoShown() if kind == "go" else None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)
        procs.append(proc)
        for line in proc.stdout:
            log.write(line)
            line = line.rstrip("\n")
            lines.append(line)
            for l in go_shown.feed(line) if go_shown else [line] if shown(kind, line) else []:
                say(l)
        rc = proc.wait()
    done.set()
    secs = time.monotonic() - start
    p, f, s = count(kind, lines)
    if kind == "plain" and rc == 0 and p + f == 0:
        p = 1  # a plain suite that printed no counts: its exit status is its one result
    if rc != 0 and f == 0:
        f = 1  # a failure the counts did not see (build error, crash)
        if kind == "c" or kind == "go":
            for l in lines[-30:]:
                print(f"[{name}] {l}", flush=True)
    with open(f"build/results/{name}.tsv", "w") as out:
        out.write(f"{name}\t{p}\t{f}\t{s}\t{secs:.1f}\t{rc}\n")
    with open(f"build/results/{name}.skips", "w") as out:
        for n, reason in skip_reasons(kind, lines):
            out.write(f"{n}\t{reason}\n")
    say(f"{'ok' if rc == 0 else 'FAILED (exit %d)' % rc}: {p} passed, {f} failed, {s} skipped in {secs:.1f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
