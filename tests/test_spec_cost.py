"""attnspec.specs.cost: the FLOP and memory model, checked against counts done another way."""
import numpy as np
import pytest

from attnspec.specs import cost
from attnspec.specs.problem import causal_mask


def test_forward_is_4_B_H_L2_E():
    assert cost.forward_flops(2, 8, 128, 128, 64) == 4 * 2 * 8 * 128 * 128 * 64
    assert cost.forward_flops(1, 1, 3, 5, 4, Ev=2) == 2 * 3 * 5 * 4 + 2 * 3 * 5 * 2


def test_seed_003_counts_as_multiplies():
    """Seed 003: QK^T for T=4, d=4 is 64 muls; 2048^2*64 = 268M muls; FLOPs = 2 * muls."""
    assert cost.forward_flops(1, 1, 4, 4, 4) == 2 * (64 + 64)
    assert cost.forward_flops(1, 1, 2048, 2048, 64) // 4 == 2048**2 * 64 == 268_435_456


@pytest.mark.parametrize("Lq,Lk", [(1, 1), (4, 4), (3, 7), (7, 3), (64, 64)])
def test_causal_counts_only_visible_pairs(Lq, Lk):
    pairs = int(causal_mask(Lq, Lk).sum())
    assert cost.visible_pairs(Lq, Lk, causal=True) == pairs
    assert cost.forward_flops(2, 3, Lq, Lk, 8, causal=True) == 2 * 2 * 3 * pairs * 16
    assert cost.visible_pairs(Lq, Lk) == Lq * Lk


def test_backward_is_two_and_a_half_forward():
    assert cost.backward_flops(1, 2, 16, 16, 8, causal=True) == 2.5 * cost.forward_flops(1, 2, 16, 16, 8, causal=True)


def test_score_matrix_bytes_matches_numpy():
    assert cost.score_matrix_bytes(2, 4, 8, 16, 2) == np.empty((2, 4, 8, 16), np.float16).nbytes
    assert cost.score_matrix_bytes(1, 32, 8192, 8192, 4) == 8 * 2**30  # the 8 GiB that flash avoids


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_bad_sizes_are_named(bad):
    with pytest.raises(ValueError, match=r"Lk must be a positive integer"):
        cost.forward_flops(1, 1, 4, bad, 4)
    with pytest.raises(ValueError, match=r"itemsize must be a positive integer"):
        cost.score_matrix_bytes(1, 1, 4, 4, bad)


# -- masked pair counts and bytes moved (benchmarks) ------------------------------------------------

from attnspec.specs.problem import window_mask  # noqa: E402


@pytest.mark.parametrize("Lq,Lk", [(1, 1), (1, 9), (4, 9), (9, 4), (16, 16), (5, 33)])
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("window", [None, (0, 0), (3, None), (None, 2), (2, 5), (40, 40)])
@pytest.mark.parametrize("causal", [False, True])
def test_pairs_visible_counts_the_spec_masks(Lq, Lk, alignment, window, causal):
    """Against the masks specs.problem defines, counted cell by cell."""
    keep = np.ones((Lq, Lk), dtype=bool)
    if causal:
        keep &= causal_mask(Lq, Lk, alignment)
    if window is not None:
        keep &= window_mask(Lq, Lk, window, alignment)
    assert cost.pairs_visible(Lq, Lk, causal, alignment, window) == int(keep.sum())


def test_pairs_visible_agrees_with_visible_pairs_and_flops():
    assert cost.pairs_visible(7, 3, causal=True) == cost.visible_pairs(7, 3, causal=True)
    assert cost.useful_flops(2, 8, 64, 64, 16, causal=True) == cost.forward_flops(2, 8, 64, 64, 16, causal=True)
    # a sliding window of 256 keys to the left at T = 2048: 2048 * 257 - 256 * 257 / 2 pairs
    assert cost.pairs_visible(2048, 2048, True, window=(256, 0)) == 2048 * 257 - 256 * 257 // 2


def test_bytes_moved_matches_numpy_buffers():
    q = np.empty((2, 8, 4, 64), np.float16)  # (B, Hq, Lq, E)
    kv = np.empty((2, 2, 1000, 64), np.float16)  # (B, Hkv, Lk, E), keys and values alike
    assert cost.kv_bytes(2, 2, 1000, 64, None, 2) == 2 * kv.nbytes
    assert cost.bytes_moved(2, 8, 2, 4, 1000, 64, None, 2) == 2 * kv.nbytes + 2 * q.nbytes


@pytest.mark.parametrize("kwargs, message", [
    (dict(window=(-1, 0)), "window left must be None or a non-negative integer"),
    (dict(window=(0, 1.5)), "window right must be None or a non-negative integer"),
    (dict(causal_alignment="bottom"), "causal_alignment must be 'top_left' or 'bottom_right'"),
])
def test_pairs_visible_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cost.pairs_visible(4, 4, **kwargs)
