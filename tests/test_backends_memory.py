"""Extra memory of the NumPy backends' forward, measured with tracemalloc (NumPy reports
its buffers to it): numpy-naive holds one score matrix, numpy-tiled one key tile.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from attnspec.backends.numpy_backends import _ROW_BLOCK, NumpyNaive, NumpyTiled
from attnspec.specs.cost import score_matrix_bytes

B, H, T, E = 1, 2, 512, 16
ITEM = 4  # float32


def _peak(fn) -> int:
    fn()  # warm NumPy's own caches first
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def qkv_mask():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, T, E)).astype(np.float32) for _ in range(3))  # (B, H, T, E)
    return q, k, v, rng.random((T, T)) > 0.2  # (T, T)


OUTPUT = B * H * T * E * ITEM  # the result itself
ROWS = 8 * B * H * T * ITEM  # (B, H, T, 1) row vectors: max, sum, their shifts


@pytest.mark.parametrize("masked,causal", [(False, False), (False, True), (True, False), (True, True)])
def test_numpy_naive_holds_one_score_matrix(qkv_mask, masked, causal):
    q, k, v, mask = qkv_mask
    scores = score_matrix_bytes(B, H, T, T, ITEM)
    peak = _peak(lambda: NumpyNaive().native_forward(q, k, v, mask if masked else None, causal, None))
    # allowed beyond the score matrix: the mask path's one (T, T) bool ~mask; the causal
    # path's (row block, T) bool comparisons, a few alive at once while numpy applies `where`
    extra = (T * T if masked else 0) + (4 * _ROW_BLOCK * T if causal else 0)
    assert scores <= peak <= scores + OUTPUT + ROWS + extra, f"peak {peak} vs scores {scores}"


@pytest.mark.parametrize("block", [32, 64])
@pytest.mark.parametrize("masked,causal", [(False, False), (True, True)])
def test_numpy_tiled_holds_one_tile(qkv_mask, block, masked, causal):
    q, k, v, mask = qkv_mask
    tile = B * H * T * block * ITEM  # (B, H, T, block) scores of one key block
    peak = _peak(lambda: NumpyTiled(block).native_forward(q, k, v, mask if masked else None, causal, None))
    # one tile alive, plus the output accumulator, its rescaled copy and the division's result
    # (3 x OUTPUT), the row vectors, and the mask path's (T, block) bool slice negation
    extra = (T * block if masked else 0) + (4 * _ROW_BLOCK * block if causal else 0)
    assert peak <= tile + 3 * OUTPUT + ROWS + extra, f"peak {peak} vs tile {tile}"
    assert peak < score_matrix_bytes(B, H, T, T, ITEM) / 2  # never the score matrix


@pytest.mark.parametrize("name", ["flax-linen", "keras-jax"])
def test_xlas_plan_for_a_length_first_backend_sizes_the_whole_score_matrix(name):
    """XLA's memory plan of the call is made on the arrays the call takes: (B, L, H, E) for a backend
    that declares `length_before_heads` (Flax, Keras).  Handed (B, H, L, E), the library read L = H and
    sized (B, T, 8, 8) scores, linear in T, not the (B, H, T, T) an unfused kernel holds."""
    from attnspec.backends.registry import resolve
    from attnspec.benchmarks import _memory

    backend = resolve(name)
    ok, why = backend.availability()
    if not ok:
        pytest.skip(why)
    rng = np.random.default_rng(1)
    heads, length = 8, 256
    inputs = tuple(rng.standard_normal((1, heads, length, 64)) for _ in range(4))  # q, k, v, grad_out: (B, H, T, E)
    extra = _memory.xla_extra(backend, inputs, "forward", "float32")
    if extra is None:
        pytest.skip("this platform gives no memory analysis")
    assert extra >= score_matrix_bytes(1, heads, length, length, ITEM), extra
