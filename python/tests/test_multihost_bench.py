"""The parts of bench/multihost_bench.py that need no torch and no GPU: its
arguments, the imitated machines' environments, the references its checks
use, and the table it prints."""

import argparse
import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "multihost_bench.py"


@pytest.fixture(scope="module")
def mb():
    spec = importlib.util.spec_from_file_location("multihost_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_arguments(mb):
    a = mb.parse_args(["--imitate", "2x4", "--max-mib", "1", "--colls", "all_reduce,reduce_scatter"])
    assert a.imitate == (2, 4)
    assert a.colls == ["all_reduce", "reduce_scatter"]
    assert a.min_kib == 4 and a.max_mib == 1 and not a.smoke
    assert mb.parse_args([]).colls == list(mb.COLLS)
    with pytest.raises(SystemExit):
        mb.parse_args(["--colls", "all_to_all"])
    with pytest.raises(SystemExit):
        mb.parse_args(["--min-kib", "2048", "--max-mib", "1"])
    with pytest.raises(argparse.ArgumentTypeError):
        mb.parse_layout("2by4")
    with pytest.raises(argparse.ArgumentTypeError):
        mb.parse_layout("0x4")


def test_sizes(mb):
    s = mb.sizes(4, 256)
    assert s[0] == 4 << 10 and s[-1] == 256 << 20
    assert all(b == 4 * a for a, b in zip(s, s[1:]))
    assert len(s) == 9
    assert mb.sizes(4, 1) == [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20]


def test_rank_env_imitates_machines(mb):
    base = {"PATH": "/bin", "SYMMEM_MACHINE_ID": "leaked", "NCCL_NVLS_ENABLE": "1"}
    envs = [mb.rank_env(r, (2, 2), base, "/tmp/s", 29500, gpus=4) for r in range(4)]
    assert [e["SYMMEM_MACHINE_ID"] for e in envs] == ["imitated-machine-0"] * 2 + ["imitated-machine-1"] * 2
    assert [e["SYMMEM_SOCKET_DIR"] for e in envs] == ["/tmp/s/machine-0"] * 2 + ["/tmp/s/machine-1"] * 2
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert [e["MULTIHOST_BENCH_DEVICE"] for e in envs] == ["0", "1", "2", "3"]
    for r, e in enumerate(envs):
        assert e["RANK"] == str(r) and e["WORLD_SIZE"] == "4" and e["MASTER_PORT"] == "29500"
        # NCCL sees one host per imitated machine (P2P and SHM inside it);
        # never multicast.
        assert e["NCCL_HOSTID"] == f"imitated-machine-{r // 2}"
        assert "NCCL_P2P_DISABLE" not in e and "NCCL_SHM_DISABLE" not in e
        assert e["NCCL_NVLS_ENABLE"] == "0"
        assert e["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and e["NVSHMEM_DISABLE_NVLS"] == "1"
        assert "SYMMEM_ALLOW_OVERLAPPING_DEVICES" not in e
    assert base["SYMMEM_MACHINE_ID"] == "leaked", "the caller's environment is not changed"
    smoke = [mb.rank_env(r, (1, 2), base, "/tmp/s", 1, gpus=1, smoke=True) for r in range(2)]
    assert all(e["SYMMEM_ALLOW_OVERLAPPING_DEVICES"] == "1" and e["MULTIHOST_BENCH_DEVICE"] == "0" for e in smoke)
    assert "NCCL_P2P_DISABLE" not in smoke[0] and "NCCL_HOSTID" not in smoke[0]
    # --transport network: NCCL's network transport between every pair.
    net = mb.rank_env(3, (2, 2), base, "/tmp/s", 29500, gpus=4, transport="network")
    assert net["NCCL_P2P_DISABLE"] == "1" and net["NCCL_SHM_DISABLE"] == "1"
    assert net["NCCL_HOSTID"] == "imitated-machine-1"


@pytest.mark.parametrize("world", [2, 3, 16])
def test_references(mb, world):
    n_out = 12
    # all_reduce: every rank's inputs summed.
    for i in range(n_out):
        s = sum(mb.input_values("all_reduce", i, r) for r in range(world))
        assert mb.expected_values("all_reduce", i, 0, world, n_out) == s
    # reduce_scatter: rank k keeps slice k of the sum.
    for k in range(world):
        for i in range(n_out):
            g = k * n_out + i
            s = sum(mb.input_values("reduce_scatter", g, r) for r in range(world))
            assert mb.expected_values("reduce_scatter", i, k, world, n_out) == s
    # all_gather: block r is rank r's input.
    per = 5
    for i in range(per * world):
        assert mb.expected_values("all_gather", i, 0, world, per * world) == mb.input_values("all_gather", i % per, i // per)
    # Exact in bfloat16: integers up to 256 in every partial sum.
    assert max(mb.expected_values(c, i, 0, world, n_out) for c in ("all_reduce",) for i in range(n_out)) <= 256


def test_table(mb):
    rows0 = [{"coll": "all_reduce", "impl": "libsymmem", "bytes": 4096, "us": 10.0},
             {"coll": "all_reduce", "impl": "nccl (plain)", "bytes": 4096, "us": 20.0},
             {"coll": "all_gather", "impl": "libsymmem", "bytes": 1 << 20, "us": None}]
    rows1 = [{"coll": "all_reduce", "impl": "libsymmem", "bytes": 4096, "us": 12.5},
             {"coll": "all_reduce", "impl": "nccl (plain)", "bytes": 4096, "us": 19.0},
             {"coll": "all_gather", "impl": "libsymmem", "bytes": 1 << 20, "us": 30.0}]
    text = mb.format_table([rows0, rows1], 2)
    lines = text.splitlines()
    assert "rank 0 us" in lines[0] and "rank 1 us" in lines[0] and "busbw GB/s" in lines[0]
    ours = next(l for l in lines if "all_reduce" in l and "libsymmem" in l)
    assert "4 KiB" in ours and "10.00" in ours and "12.50" in ours
    # Bus bandwidth from the slowest rank: 4096 * 2 * 1/2 / 12.5 us.
    assert f"{4096 / 12.5 / 1e3:11.1f}".strip() in ours
    failed = next(l for l in lines if "all_gather" in l)
    assert "1 MiB" in failed and "30.00" in failed and failed.rstrip().endswith("-")
    # all_reduce rows come before all_gather rows.
    assert lines.index(ours) < lines.index(failed)


def test_ranks_that_reported_and_hang_are_ended(mb, tmp_path, monkeypatch):
    """Note [Teardown across imitated machines]: a rank that reported its
    status and then never exits is ended after the grace period, and its
    reported status counts; a rank that exits keeps its own status."""
    import subprocess
    import sys
    import time

    monkeypatch.setattr(mb, "EXIT_GRACE_S", 0.5)
    done = tmp_path / "done"
    done.mkdir()

    def rank(r, status, then):
        code = f"open({str(done / f'rank-{r}')!r}, 'w').write('{status}'); {then}"
        return subprocess.Popen([sys.executable, "-c", code])

    t0 = time.monotonic()
    procs = [rank(0, 0, "import time; time.sleep(600)"), rank(1, 0, "pass")]
    assert mb.wait_ranks(procs, str(done)) == 0
    assert time.monotonic() - t0 < 30
    assert procs[0].returncode == -9 and procs[1].returncode == 0

    for f in done.iterdir():
        f.unlink()
    procs = [rank(0, 1, "import time; time.sleep(600)"), rank(1, 0, "pass")]
    assert mb.wait_ranks(procs, str(done)) == 1  # rank 0 reported a failure

    for f in done.iterdir():
        f.unlink()
    # A rank that dies before reporting fails the run; nobody is ended
    # before every rank has reported.
    procs = [subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]), rank(1, 0, "pass")]
    assert mb.wait_ranks(procs, str(done)) == 3
