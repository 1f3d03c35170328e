"""A block freed while a kernel still uses it is not handed to other work
before that kernel is done.

(a) x lives on stream s1, where a long kernel (torch.cuda._sleep) runs and
    then writes x; x is deleted at once; s2 allocates and writes y. If y got
    x's memory before s1's work was done, s1's late write would land in y.
(b) x is allocated on s1 but used on s2 (record_stream); deleted at once; s1
    allocates y and writes it. Without honouring record_stream, y reuses x
    on s1 at once and s2's late write lands in y.
(c) same stream: reuse is immediate and stream order keeps it correct.
"""

from __future__ import annotations

import sys

from _common import install_symmem, result

N = 1 << 20
CYCLES = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000_000  # ~0.5 s


def main() -> None:
    install_symmem()
    import torch

    import symmem

    torch.cuda.init()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    out = {}

    # (a)
    with torch.cuda.stream(s1):
        x = torch.zeros(N, device="cuda")
        torch.cuda._sleep(CYCLES)
        x.fill_(1.0)
        px = x.data_ptr()
        del x
    with torch.cuda.stream(s2):
        y = torch.empty(N, device="cuda")
        y.fill_(2.0)
    torch.cuda.synchronize()
    out["a_ok"] = bool(torch.all(y == 2.0))
    out["a_same_ptr"] = y.data_ptr() == px
    del y

    # (b)
    with torch.cuda.stream(s1):
        x = torch.zeros(N, device="cuda")
    s2.wait_stream(s1)
    with torch.cuda.stream(s2):
        torch.cuda._sleep(CYCLES)
        x.fill_(1.0)
    x.record_stream(s2)
    px = x.data_ptr()
    del x
    with torch.cuda.stream(s1):
        y = torch.empty(N, device="cuda")
        y.fill_(2.0)
    torch.cuda.synchronize()
    out["b_ok"] = bool(torch.all(y == 2.0))
    out["b_same_ptr"] = y.data_ptr() == px
    del y

    # (c)
    with torch.cuda.stream(s1):
        x = torch.zeros(N, device="cuda")
        torch.cuda._sleep(CYCLES)
        x.fill_(1.0)
        px = x.data_ptr()
        del x
        y = torch.empty(N, device="cuda")
        y.fill_(2.0)
    torch.cuda.synchronize()
    out["c_ok"] = bool(torch.all(y == 2.0))
    out["c_same_ptr"] = y.data_ptr() == px
    del y
    torch.cuda.synchronize()
    symmem.validate(0)
    result(**out)


if __name__ == "__main__":
    main()
