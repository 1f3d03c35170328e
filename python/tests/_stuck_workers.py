"""A rank of the abort and Ctrl-C tests (test_abort_interrupt.py), run as
``python _stuck_workers.py MODE RANK NAME`` in a process of its own, with
two ranks in all. It prints lines the test reads:

    READY                      about to wait (the test may send SIGINT)
    KEYBOARDINTERRUPT <t>      KeyboardInterrupt arrived at time.monotonic() t
    WAITED <s> <outcome>       a wait that the abort ended, after s seconds
    RESULT ok | RESULT <why>   the rank's verdict

Modes:
    join        this rank forms a group whose peer never comes (SIGINT)
    barrier     a barrier that rank 1 never enters (SIGINT to rank 0)
    abort-killed, abort-stopped
                rank 1 kills (stops) itself after a first barrier; rank 0
                enters a second one and another thread aborts the group
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import symmem


def _device(rank: int) -> int:
    return rank % symmem.device_count()


def main() -> int:
    mode, rank, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode == "join":
        print("READY", flush=True)
        try:
            symmem.Group(name, rank, 2, device=_device(rank), timeout=60)
        except KeyboardInterrupt:
            print("KEYBOARDINTERRUPT", time.monotonic(), flush=True)
            return 0
        print("RESULT the group formed without its peer", flush=True)
        return 1
    g = symmem.Group(name, rank, 2, device=_device(rank), timeout=60)
    buf = symmem.empty(1 << 16, device=g.device)
    h = g.rendezvous(buf)
    h.barrier()
    symmem.copy(buf.ptr, buf.ptr, 4, device=g.device)  # the barrier's stream has run
    if rank == 1:
        if mode == "abort-killed":
            os.kill(os.getpid(), signal.SIGKILL)
        elif mode == "abort-stopped":
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(120)  # never comes
        return 0
    if mode == "barrier":
        print("READY", flush=True)
        try:
            h.barrier(channel=1)
        except KeyboardInterrupt:
            print("KEYBOARDINTERRUPT", time.monotonic(), flush=True)
        else:
            print("RESULT the barrier returned without its peer", flush=True)
            return 1
        try:
            h.barrier()
        except symmem.AbortedError:
            pass
        else:
            print("RESULT the interrupted group is not aborted", flush=True)
            return 1
        h.release()
        g.destroy()
        print("RESULT ok", flush=True)
        return 0
    # abort-*: the wait released by Group.abort from another thread.
    threading.Timer(0.3, g.abort).start()
    t0 = time.monotonic()
    outcome = "returned"
    try:
        h.barrier(channel=1)
        if symmem.backend_name() != "host":  # enqueued: wait behind it
            symmem.copy(buf.ptr, buf.ptr, 4, device=g.device)
    except symmem.AbortedError:
        outcome = "aborted"
    except symmem.PeerError:
        outcome = "peer"
    print("WAITED", time.monotonic() - t0, outcome, flush=True)
    time.sleep(0.5)  # the abort has run
    for what, call in [("barrier", lambda: h.barrier()), ("wait_signal", lambda: h.wait_signal(1)),
                       ("rendezvous", lambda: g.rendezvous(buf))]:
        try:
            call()
        except symmem.AbortedError:
            continue
        print(f"RESULT {what} after the abort did not raise AbortedError", flush=True)
        return 1
    g.abort()
    h.release()
    g.destroy()
    print("RESULT ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
