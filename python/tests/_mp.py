"""Run a function as several ranks, each in its own (spawned) process.

``run_ranks(fn, world, *args)`` starts ``world`` processes with the
multiprocessing 'spawn' method (a fresh interpreter each, as real ranks
are), calls ``fn(rank, world, *args)`` in each, and returns the results in
rank order. An exception in a rank is re-raised here with the rank's
traceback; a rank that hangs or dies fails the test instead of hanging it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from typing import Any, Callable, Dict, List, Optional


class RankFailed(AssertionError):
    """A rank raised, died, or did not finish in time."""


def _entry(fn: Callable, rank: int, world: int, args: tuple, out) -> None:
    try:
        result = fn(rank, world, *args)
        out.put((rank, "ok", result, ""))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        try:
            out.put((rank, "err", exc, traceback.format_exc()))
        except Exception:  # unpicklable exception
            out.put((rank, "err", None, traceback.format_exc()))


def run_ranks(fn: Callable, world: int, *args: Any, timeout: float = 120.0, allow_errors: bool = False,
              env: Optional[Callable[[int], Dict[str, str]]] = None) -> List[Any]:
    """Results of fn(rank, world, *args) for each rank (see module doc).

    With allow_errors=True, a rank's exception is returned as its result
    instead of failing the test (for tests that expect errors). env(rank),
    if given, is extra environment of that rank's process, in place when the
    process starts (the library reads its settings from the environment the
    process started with: setting them later from Python is not seen).
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, args, out), daemon=True) for r in range(world)]
    for r, p in enumerate(procs):
        extra = env(r) if env is not None else {}
        saved = {k: os.environ.get(k) for k in extra}
        os.environ.update(extra)
        try:
            p.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    results: dict = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RankFailed(f"ranks {sorted(set(range(world)) - set(results))} did not finish in {timeout} s")
            try:
                rank, status, value, tb = out.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in results and p.exitcode not in (None, 0)]
                if dead:
                    # Give the queue a moment: a rank may have reported and exited.
                    time.sleep(0.5)
                    if out.empty():
                        codes = {r: procs[r].exitcode for r in dead}
                        raise RankFailed(f"ranks died without reporting: exit codes {codes}")
                continue
            if status == "err" and not allow_errors:
                raise RankFailed(f"rank {rank} failed:\n{tb}")
            results[rank] = value if status == "ok" else (value if value is not None else RankFailed(tb))
    finally:
        for p in procs:
            p.join(timeout=5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return [results[r] for r in range(world)]
