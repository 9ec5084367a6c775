"""Per-sequence positions (issue 30): causal, window and ALiBi aligned per sequence; left padding.

Hand-computed small cases, and the reference against an independent loop over (b, h, i, j) that
counts positions from first principles: sequence b's keys are [kv_starts_b, kv_lengths_b), key j at
position j - kv_starts_b; its queries [0, q_lengths_b), bottom-right query i at position
i + (kv_lengths_b - kv_starts_b) - q_lengths_b, top-left at i.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from attnspec.specs import invariants, reference
from attnspec.specs.masks import alibi_slopes, sequence_offsets
from attnspec.specs.problem import validate, visible


def _loop(q, k, v, q_lengths, kv_lengths, kv_starts, alignment, causal, window, slopes, scale):
    """softmax attention by explicit loops, positions counted per sequence; empty rows zeros."""
    B, H, Lq, _ = q.shape
    out = np.zeros(q.shape[:-1] + v.shape[-1:])  # (B, H, Lq, Ev)
    vis = np.zeros((B, H, Lq, k.shape[-2]), dtype=bool)
    for b in range(B):
        s0, n, m = kv_starts[b], kv_lengths[b] - kv_starts[b], q_lengths[b]
        for h in range(H):
            for i in range(m):
                qpos = i + n - m if alignment == "bottom_right" else i
                scores, rows = [], []
                for j in range(s0, kv_lengths[b]):
                    kpos = j - s0
                    if causal and kpos > qpos:
                        continue
                    left, right = (None, None) if window is None else window
                    if left is not None and kpos < qpos - left or right is not None and kpos > qpos + right:
                        continue
                    bias = 0.0 if slopes is None else -slopes[h] * abs(qpos - kpos)
                    scores.append(scale * float(q[b, h, i] @ k[b, h, j]) + bias)
                    rows.append(j)
                    vis[b, h, i, j] = True
                if scores:
                    top = max(scores)
                    e = [math.exp(x - top) for x in scores]
                    out[b, h, i] = sum(w * v[b, h, j] for w, j in zip(e, rows, strict=True)) / sum(e)
    return out, vis


@pytest.mark.parametrize("alignment", ["bottom_right", "top_left"])
@pytest.mark.parametrize("causal, window, alibi", [(True, None, False), (False, (1, 0), False),
                                                   (True, (2, None), True), (False, None, True)])
def test_reference_counts_positions_per_sequence_as_a_loop_does(alignment, causal, window, alibi):
    rng = np.random.default_rng(30)
    B, H, Lq, Lk, E = 3, 2, 5, 7, 4
    q, k, v = rng.standard_normal((B, H, Lq, E)), rng.standard_normal((B, H, Lk, E)), rng.standard_normal((B, H, Lk, E))
    ql, kl, ks = np.array([5, 2, 4]), np.array([7, 6, 3]), np.array([0, 3, 1])
    slopes = alibi_slopes(H) if alibi else None
    f = reference.forward(q, k, v, is_causal=causal, scale=0.5, causal_alignment=alignment, window=window,
                          alibi_slopes=slopes, positions="per_sequence", q_lengths=ql, kv_lengths=kl, kv_starts=ks)
    want, want_vis = _loop(q, k, v, ql, kl, ks, alignment, causal, window, slopes, 0.5)
    np.testing.assert_array_equal(f.visible, want_vis)
    np.testing.assert_allclose(f.output, want, rtol=1e-13, atol=1e-14)


def test_a_hand_computed_chunked_prefill_batch():
    """Sequence 0: 3 new queries after 2 cached keys (Lk_0 = 5); sequence 1: one decode query after 2
    keys, cache left-padded by 1 (keys 1..3); sequence 2 the whole square.  Causal, bottom-right."""
    q, k = np.zeros((3, 1, 3, 2)), np.zeros((3, 1, 5, 2))
    p = validate(q, k, k, is_causal=True, causal_alignment="bottom_right", positions="per_sequence",
                 q_lengths=np.array([3, 1, 3]), kv_lengths=np.array([5, 4, 3]), kv_starts=np.array([0, 1, 0]))
    assert p.offsets.tolist() == [2, 3, 0]
    want = np.array([[[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]],
                     [[0, 1, 1, 1, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]],
                     [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]], dtype=bool)
    np.testing.assert_array_equal(visible(p)[:, 0], want)
    # the same batch with global positions aligns every sequence at Lk - Lq = 2: sequence 2's row 0 sees 3 keys
    g = validate(q, k, k, is_causal=True, causal_alignment="bottom_right", q_lengths=np.array([3, 1, 3]),
                 kv_lengths=np.array([5, 4, 3]))
    assert g.offsets is None and visible(g)[2, 0, 0].tolist() == [True, True, True, False, False]


def test_sequence_offsets_by_alignment():
    assert sequence_offsets(4, 6, "bottom_right").tolist() == 2
    assert sequence_offsets(4, 6, "bottom_right", np.array([4, 1]), np.array([6, 6]), np.array([0, 3])).tolist() == [2, 5]
    assert sequence_offsets(4, 6, "top_left", np.array([4, 1]), np.array([6, 6]), np.array([0, 3])).tolist() == [0, 3]


def test_per_sequence_without_lengths_is_the_global_alignment():
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 2, 3, 4)), rng.standard_normal((2, 2, 6, 4))
    for alignment in ("bottom_right", "top_left"):
        kw = dict(is_causal=True, causal_alignment=alignment, window=(2, None), alibi_slopes=alibi_slopes(2))
        a, b = reference.forward(q, k, k, **kw), reference.forward(q, k, k, positions="per_sequence", **kw)
        np.testing.assert_array_equal(a.visible, b.visible)
        np.testing.assert_array_equal(a.output, b.output)


def test_left_padding_by_p_equals_the_unpadded_problem_whatever_it_holds():
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 5, 3))
    kw = dict(is_causal=True, causal_alignment="bottom_right", alibi_slopes=alibi_slopes(2), window=(3, 0))
    plain = reference.forward(q, k, v, **kw)
    pad = 2
    # (1, 2, 7, 4): garbage in the left padding (the reference multiplies hidden values by zero weights,
    # so it is finite here; NaN there is for the backends' isolation properties)
    kp = np.concatenate([np.full((1, 2, pad, 4), 1e30), k], axis=-2)
    vp = np.concatenate([np.full((1, 2, pad, 3), -7e20), v], axis=-2)
    padded = reference.forward(q, kp, vp, positions="per_sequence", kv_starts=np.array([pad]), **kw)
    np.testing.assert_allclose(padded.output, plain.output, rtol=1e-14, atol=0)
    assert not padded.visible[..., :pad].any()


def test_zero_future_mass_is_judged_per_sequence():
    q, k = np.zeros((2, 1, 2, 2)), np.zeros((2, 1, 4, 2))
    p = validate(q, k, k, is_causal=True, causal_alignment="bottom_right", positions="per_sequence",
                 q_lengths=np.array([1, 2]), kv_lengths=np.array([4, 2]))
    w = reference.forward(p).weights  # (2, 1, 2, 4)
    assert invariants.zero_future_mass(w, "bottom_right", p.offsets)
    # sequence 0's one query sits at position 3 and sees all four keys: past the global diagonal (o = 2)
    assert not invariants.zero_future_mass(w, "bottom_right")
    leaky = w.copy()
    leaky[1, 0, 0, 1] = 1e-300  # sequence 1's first query sees key 0 only
    assert not invariants.zero_future_mass(leaky, "bottom_right", p.offsets)


@pytest.mark.parametrize("kw, message", [
    (dict(positions="per_seq"), "positions must be one of"),
    (dict(kv_starts=np.array([1, 0])), "needs positions='per_sequence'"),
    (dict(positions="per_sequence", kv_starts=np.array([3, 0]), kv_lengths=np.array([2, 4])), "must not exceed kv_lengths"),
    (dict(positions="per_sequence", kv_starts=np.array([5, 0])), r"kv_starts must lie in \[0, 4\]"),
    (dict(positions="per_sequence", kv_starts=np.array([1.0, 0.0])), "kv_starts must be an integer array"),
    (dict(positions="per_sequence", kv_starts=np.array([1, 0, 0])), "kv_starts of shape"),
])
def test_bad_positions_name_the_argument(kw, message):
    q, k = np.zeros((2, 1, 3, 2)), np.zeros((2, 1, 4, 2))
    with pytest.raises(ValueError, match=message):
        validate(q, k, k, **kw)


def test_per_sequence_positions_need_a_head_axis():
    with pytest.raises(ValueError, match="positions='per_sequence' needs inputs with a head axis"):
        validate(np.zeros((3, 2)), np.zeros((4, 2)), np.zeros((4, 2)), positions="per_sequence")


def test_the_feature_is_per_sequence_positions():
    q, k = np.zeros((2, 1, 3, 2)), np.zeros((2, 1, 4, 2))
    assert "seq_positions" in validate(q, k, k, positions="per_sequence").features
    assert "seq_positions" not in validate(q, k, k).features
    # bottom-right matters per sequence even where the padded shapes are square
    sq = np.zeros((2, 1, 4, 2))
    assert "causal_bottom_right" in validate(sq, sq, sq, is_causal=True, causal_alignment="bottom_right",
                                              positions="per_sequence", kv_lengths=np.array([4, 2])).features
