"""``python -m symmem.compat [--] CMD [ARGS...]``: run CMD with libsymmem's
drop-ins installed (``import torch_memory_saver`` gives libsymmem's, in CMD
and in everything it starts). CMD replaces this process (exec), with the
same environment plus the PYTHONPATH that :func:`symmem.compat.install`
sets."""

from __future__ import annotations

import os
import sys

from ..errors import quote
from . import _subprocess_env


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args else 2
    env = dict(os.environ)
    env.update(_subprocess_env(env))
    try:
        os.execvpe(args[0], args, env)
    except (OSError, ValueError) as e:
        # OSError: not found, not executable, ...; ValueError: a name exec
        # cannot take (empty, or with a NUL byte). Either way one line and
        # 127, as a shell says of a command it cannot run.
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        print(f"python -m symmem.compat: cannot run {quote(args[0])}: {why}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
