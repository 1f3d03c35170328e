"""Progress while waiting (SYMMEM_WAIT_REPORT_S): a rank whose peers do not
come prints lines to stderr naming the group, what it waits for and who."""

import os
import subprocess
import sys

SCRIPT = r"""
import sys, symmem
try:
    symmem.Group(sys.argv[1], 0, 3, timeout=1.0)
except symmem.TimeoutError as e:
    print("timeout:", e)
"""


def test_missing_rank_is_named_while_waiting(tmp_path):
    env = dict(os.environ, SYMMEM_WAIT_REPORT_S="0.25", SYMMEM_SOCKET_DIR=str(tmp_path / "sock"))
    os.makedirs(env["SYMMEM_SOCKET_DIR"], mode=0o700)
    p = subprocess.run([sys.executable, "-c", SCRIPT, "lonely"], env=env, capture_output=True, text=True, timeout=60)
    assert "timeout:" in p.stdout, p.stdout + p.stderr
    lines = [l for l in p.stderr.splitlines() if l.startswith('symmem: group "lonely" rank 0: waiting')]
    assert len(lines) >= 2, p.stderr
    assert all("for connection: rank(s) 1, 2 not arrived yet" in l for l in lines), lines
    # 0 turns it off
    env["SYMMEM_WAIT_REPORT_S"] = "0"
    p = subprocess.run([sys.executable, "-c", SCRIPT, "quiet"], env=env, capture_output=True, text=True, timeout=60)
    assert "waiting" not in p.stderr, p.stderr
