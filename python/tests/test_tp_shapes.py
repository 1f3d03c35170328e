"""symmem._tp: the tensor-parallel operators' shapes and refusals, which
symmem.torch's operators and their fakes use (no torch needed)."""

from __future__ import annotations

import pytest

from symmem import _tp


def test_all_gather_matmul_shapes():
    assert _tp.all_gather_matmul_shapes((4, 16), [(16, 8), (16, 3)], 0, 2) == ((8, 16), [(8, 8), (8, 3)])
    assert _tp.all_gather_matmul_shapes((2, 5, 16), [(16, 8)], 1, 3) == ((2, 15, 16), [(2, 15, 8)])
    # the last dimension gathered is the one contracted
    assert _tp.all_gather_matmul_shapes((4, 16), [(32, 8)], 1, 2) == ((4, 32), [(4, 8)])


@pytest.mark.parametrize("args,msg", [
    (((16,), [(16, 8)], 0, 2), "a_shard must have at least 2 dimensions, got shape (16,)"),
    (((4, 16), [], 0, 2), "bs is empty"),
    (((4, 16), [(16, 8, 2)], 0, 2), "bs[0] must be a matrix, got shape (16, 8, 2)"),
    (((4, 16), [(16, 8), (12, 8)], 0, 2), "bs[1] has 12 rows, but the gathered A has 16 columns"),
    (((4, 16), [(16, 8)], 1, 2), "bs[0] has 16 rows, but the gathered A has 32 columns"),
    (((4, 16), [(16, 8)], 2, 2), "gather_dim 2 is not a dimension of the input (0 .. 1)"),
    (((4, 16), [(16, 8)], -1, 2), "gather_dim -1 is not a dimension of the input"),
])
def test_all_gather_matmul_refusals(args, msg):
    with pytest.raises(ValueError) as exc:
        _tp.all_gather_matmul_shapes(*args)
    assert msg in str(exc.value) and "symmem.torch.fused_all_gather_matmul" in str(exc.value)


def test_matmul_reduce_scatter_shape():
    assert _tp.matmul_reduce_scatter_shape((8, 16), (16, 4), "sum", 0, 2) == (4, 4)
    assert _tp.matmul_reduce_scatter_shape((2, 6, 16), (16, 4), "avg", 1, 3) == (2, 2, 4)
    assert _tp.matmul_reduce_scatter_shape((8, 16), (16, 4), "sum", 1, 2) == (8, 2)


@pytest.mark.parametrize("args,msg", [
    (((8, 16), (16, 4), "max", 0, 2), "reduce_op must be one of sum, avg, not 'max'"),
    (((8, 16), (12, 4), "sum", 0, 2), "a has 16 columns and b 12 rows"),
    (((9, 16), (16, 4), "sum", 0, 2), "dimension 0 of A @ B (9) does not split over 2 ranks"),
    (((8, 16), (16, 3), "sum", 1, 2), "dimension 1 of A @ B (3) does not split over 2 ranks"),
    (((8,), (16, 4), "sum", 0, 2), "a must have at least 2 dimensions"),
    (((8, 16), (16, 4), "sum", 2, 2), "scatter_dim 2 is not a dimension of the input (0 .. 1)"),
])
def test_matmul_reduce_scatter_refusals(args, msg):
    with pytest.raises(ValueError) as exc:
        _tp.matmul_reduce_scatter_shape(*args)
    assert msg in str(exc.value) and "symmem.torch.fused_matmul_reduce_scatter" in str(exc.value)


def test_rmsnorm_rows():
    assert _tp.rmsnorm_rows((2, 3, 64), (2, 3, 64), (64,)) == (6, 64)
    assert _tp.rmsnorm_rows((4096,), (4096,), (4096,)) == (1, 4096)
    for x, r, w, msg in (
        ((2, 64), (2, 32), (64,), "residual has shape (2, 32), x (2, 64): they must be equal"),
        ((2, 64), (2, 64), (32,), "weight has shape (32,), expected (64,)"),
        ((2, 12), (2, 12), (12,), "hidden 12 (x's last dimension) must be a multiple of 8 in [8, 16384]"),
        ((1, 16392), (1, 16392), (16392,), "hidden 16392"),
        ((), (), (), "x needs a hidden dimension"),
    ):
        with pytest.raises(ValueError) as exc:
            _tp.rmsnorm_rows(x, r, w)
        assert msg in str(exc.value), (x, str(exc.value))
    with pytest.raises(TypeError, match="gather_dim must be an int, not float"):
        _tp.all_gather_matmul_shapes((4, 16), [(16, 8)], 0.0, 2)
