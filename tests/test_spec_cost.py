"""specs.cost: the FLOP and memory model, checked against counts done another way."""
import numpy as np
import pytest

from specs import cost
from specs.problem import causal_mask


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
