"""Shared by the symm_*.py rank scripts of test_symm_gpu.py.

Each rank is its own process, started by the test with its parameters in the
environment:

    SYMM_RANK, SYMM_WORLD   this rank and the number of ranks
    SYMM_DEVICE             the CUDA device of this rank (set_device'd first)
    SYMM_NAME               a unique prefix for symmem.Group names
    SYMM_OUT                folder where this rank writes rank<r>.json
    SYMM_INIT               a file for torch.distributed's file:// rendezvous
    SYMM_TIMEOUT            seconds that any one wait may take (default 60)
    SYMM_DIST_TIMEOUT       torch.distributed's timeout (default 30: the ranks
                            have already met in a symmem.Group by then)

A script calls :func:`run` with its body, a function of a :class:`Rank`
that returns a JSON-able dict. ``rank<r>.json`` then holds
``{"rank", "world", "device", "ok", "result" | "error", "traceback", "stage"}``
and the process exits 0 when the body returned, 1 when it raised.

Every wait is bounded: groups get ``timeout=SYMM_TIMEOUT``; GPU work (where
signals queued on a stream would block for ever if a peer never signals) is
waited for by polling an event (:meth:`Rank.wait_gpu`), never by an
unbounded ``synchronize``; torch.distributed gets the same timeout. The
process ends with ``os._exit`` so that no destructor can hang it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple


class GpuTimeout(TimeoutError):
    """GPU work did not finish in time (a signal that never arrived?)."""


class Rank:
    """This rank's parameters, torch on its device, and bounded waits."""

    def __init__(self) -> None:
        env = os.environ
        self.rank = int(env["SYMM_RANK"])
        self.world = int(env["SYMM_WORLD"])
        self.dev = int(env["SYMM_DEVICE"])
        self.name = env["SYMM_NAME"]
        self.out_dir = env["SYMM_OUT"]
        self.init_file = env.get("SYMM_INIT", "")
        self.timeout = float(env.get("SYMM_TIMEOUT", "60"))
        self.dist_timeout = float(env.get("SYMM_DIST_TIMEOUT", "30"))
        self.t0 = time.monotonic()
        self.stage_name = "start"
        self.torch: Any = None
        self.device: Any = None
        self.dist: Any = None

    # -- progress -------------------------------------------------------------

    def stage(self, what: str) -> None:
        """Note where we are (printed to stderr: the test shows it on failure)."""
        self.stage_name = what
        sys.stderr.write(f"[rank {self.rank} cuda:{self.dev} +{time.monotonic() - self.t0:.2f}s] {what}\n")
        sys.stderr.flush()

    # -- setup ----------------------------------------------------------------

    def setup_torch(self) -> None:
        self.stage("import torch")
        import torch

        self.torch = torch
        if not torch.cuda.is_available():
            raise RuntimeError(f"rank {self.rank}: torch.cuda.is_available() is False")
        torch.cuda.set_device(self.dev)
        self.device = torch.device("cuda", self.dev)
        import symmem

        if symmem.backend_name() != "cuda":
            raise RuntimeError(
                f"rank {self.rank}: libsymmem runs on its {symmem.backend_name()!r} backend, not 'cuda' "
                f"({symmem.backend_notes().strip()})"
            )

    def group(self, suffix: str = "g", rank: Optional[int] = None, world: Optional[int] = None):
        """A symmem.Group named <SYMM_NAME>-<suffix> on this rank's device."""
        import symmem

        rank = self.rank if rank is None else rank
        world = self.world if world is None else world
        self.stage(f"symmem.Group {suffix} (rank {rank} of {world})")
        return symmem.Group(f"{self.name}-{suffix}", rank, world, device=self.dev, timeout=self.timeout)

    def init_dist(self):
        """torch.distributed with gloo over a file:// rendezvous (bounded)."""
        import datetime

        import torch.distributed as dist

        self.stage("torch.distributed.init_process_group(gloo)")
        dist.init_process_group(
            "gloo",
            init_method=f"file://{self.init_file}",
            rank=self.rank,
            world_size=self.world,
            timeout=datetime.timedelta(seconds=self.dist_timeout),
        )
        self.dist = dist
        return dist

    def new_group(self, ranks):
        import datetime

        return self.dist.new_group(ranks, timeout=datetime.timedelta(seconds=self.dist_timeout))

    # -- streams and bounded waits ------------------------------------------------

    def cur(self) -> int:
        """The raw handle of torch's current stream on our device."""
        return self.torch.cuda.current_stream(self.device).cuda_stream

    def wait_gpu(self, what: str, stream=None) -> None:
        """Wait, at most SYMM_TIMEOUT seconds, for the work queued so far on
        stream (default: the current stream); raise GpuTimeout otherwise."""
        torch = self.torch
        ev = torch.cuda.Event()
        ev.record(stream if stream is not None else torch.cuda.current_stream(self.device))
        deadline = time.monotonic() + self.timeout
        pause = 1e-5
        while not ev.query():
            if time.monotonic() > deadline:
                raise GpuTimeout(
                    f"rank {self.rank} (cuda:{self.dev}): GPU work queued up to '{what}' did not finish "
                    f"within {self.timeout:.0f} s (a signal or barrier a peer never answered?)"
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def sync(self, what: str, stream=None) -> None:
        """wait_gpu, then torch.cuda.synchronize() (which returns at once)."""
        self.stage(f"wait for GPU: {what}")
        self.wait_gpu(what, stream)
        self.torch.cuda.synchronize(self.device)


# -- small helpers for the bodies -------------------------------------------------


def first_mismatch(torch, got, want) -> Optional[Dict[str, Any]]:
    """None when got equals want, else where and how they first differ."""
    if got.shape == want.shape and bool(torch.equal(got, want)):
        return None
    if got.shape != want.shape:
        return {"shape": list(got.shape), "want_shape": list(want.shape)}
    diff = (got != want).reshape(-1)
    idx = int(diff.nonzero()[0, 0])
    return {
        "wrong": int(diff.sum()),
        "of": int(diff.numel()),
        "index": idx,
        "got": got.reshape(-1)[idx].item(),
        "want": want.reshape(-1)[idx].item(),
    }


def rank_inputs(torch, dev, world: int, dt, n: int, case: int) -> list:
    """Every rank's input of a collective check: n elements of dt for each
    of world ranks, the same on every rank (seeded by case and rank)."""
    xs = []
    for r in range(world):
        gen = torch.Generator(device=dev)
        gen.manual_seed(case * 1000 + r)
        if dt == torch.int32:
            xs.append(torch.randint(-(2**31), 2**31 - 1, (n,), generator=gen, device=dev, dtype=torch.int32))
        else:
            xs.append((torch.randn(n, generator=gen, device=dev) * 3).to(dt))
    return xs


def reduce_reference(torch, xs: list, op: str, dt):
    """The reduction of xs in rank order as the library's kernels compute it:
    int32 sums wrap, 16-bit floats accumulate in fp32 and round once."""
    if dt == torch.int32:
        acc = xs[0].to(torch.int64)
        for x in xs[1:]:
            acc = {"sum": acc + x, "max": torch.maximum(acc, x.to(torch.int64)), "min": torch.minimum(acc, x.to(torch.int64))}[op]
        if op == "sum":
            acc = (acc + 2**31) % 2**32 - 2**31
        return acc.to(torch.int32)
    acc = xs[0].float()
    for x in xs[1:]:
        acc = {"sum": acc + x.float(), "max": torch.maximum(acc, x.float()), "min": torch.minimum(acc, x.float())}[op]
    return acc.to(dt)


def typed_view(torch, base, offset: int, dt, n: int):
    """n elements of dt at byte offset of the uint8 tensor base."""
    return base[offset : offset + n * torch.tensor([], dtype=dt).element_size()].view(dt)


def pad_mismatches(ctx, h, me: int, world: int, counts: Dict[Tuple[int, int], int]) -> List[Dict[str, int]]:
    """Our signal pad against Note [Signals] (core/symm/signal.go): slot
    channel*world + sender holds how many signals sender put to us on
    channel. counts maps (channel, sender) to that number; every other slot
    must be 0. Returns the first mismatches (empty: the pad is exact)."""
    torch = ctx.torch
    pad = h.get_signal_pad(me).cpu()
    want = torch.zeros_like(pad)
    for (channel, sender), n in counts.items():
        want[channel * world + sender] = n
    bad = (pad != want).nonzero().flatten().tolist()[:5]
    return [{"slot": i, "channel": i // world, "sender": i % world, "got": int(pad[i]), "want": int(want[i])} for i in bad]


def guarded(ctx, part: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """part(), or {"error", "stage", "traceback"} if it raised: for the last
    part of a body (the torch.distributed one), so that the parts before it
    are still reported when it fails."""
    try:
        return part()
    except Exception as exc:  # noqa: BLE001 - reported to the test
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        return {"error": f"{type(exc).__name__}: {exc}", "stage": ctx.stage_name, "traceback": tb[-2000:]}


def error_info(exc: BaseException, seconds: float) -> Dict[str, Any]:
    code = getattr(exc, "code", None)
    return {
        "raised": type(exc).__name__,
        "code": int(code) if code is not None else None,
        "message": str(getattr(exc, "message", "") or exc),
        "seconds": round(seconds, 3),
    }


# -- the runner -----------------------------------------------------------------


def _write(path: str, rec: Dict[str, Any]) -> None:
    tmp = path + f".tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(rec, f, default=repr)
    os.replace(tmp, path)


def run(body: Callable[[Rank], Dict[str, Any]]) -> None:
    """Run body(rank) and report to rank<r>.json; never returns."""
    ctx = Rank()
    rec: Dict[str, Any] = {"rank": ctx.rank, "world": ctx.world, "device": ctx.dev, "ok": False}
    code = 1
    try:
        ctx.setup_torch()
        result = body(ctx)
        ctx.stage("validate the allocator")
        import symmem

        symmem.validate(ctx.dev)
        rec["result"] = result
        rec["ok"] = True
        code = 0
        ctx.stage("done")
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["traceback"] = traceback.format_exc()
        sys.stderr.write(rec["traceback"])
    rec["stage"] = ctx.stage_name
    rec["seconds"] = round(time.monotonic() - ctx.t0, 2)
    try:
        _write(os.path.join(ctx.out_dir, f"rank{ctx.rank}.json"), rec)
    except BaseException:  # noqa: BLE001
        sys.stderr.write(traceback.format_exc())
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
