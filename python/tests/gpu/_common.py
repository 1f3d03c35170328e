"""Shared bits of the GPU scripts: the result line and the global allocator.

Each script runs in a fresh process (torch's allocator can only be changed
before CUDA is initialised) and ends by printing one line
``RESULT <json>`` that test_torch_gpu.py parses.
"""

from __future__ import annotations

import json
import sys


def install_symmem() -> None:
    """Make libsymmem torch's global CUDA allocator (first thing)."""
    import symmem.torch as st

    st.use_as_global_allocator()


def result(**values) -> None:
    sys.stdout.write("RESULT " + json.dumps(values) + "\n")
    sys.stdout.flush()
