"""Each invariant on arrays that hold it and on arrays that break it (where, amount)."""
import math

import numpy as np
import pytest

from attnspec.specs import invariants as inv
from attnspec.specs import reference as ref


@pytest.fixture
def fw():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(2, 3, 5, 4)), rng.normal(size=(2, 3, 6, 4)), rng.normal(size=(2, 3, 6, 3))
    return ref.forward(q, k, v, is_causal=True)


def test_verdict_is_truthy_exactly_when_it_holds():
    assert inv.Verdict("x", True, None, 0.0, "")
    assert not inv.Verdict("x", False, (0,), 1.0, "")


def test_reference_satisfies_every_invariant(fw):
    v = fw.problem.value
    assert inv.weights_nonnegative(fw.weights, fw.visible)
    assert inv.rows_sum_to_one(fw.weights, fw.visible, atol=1e-14)
    assert inv.order_preserved(fw.scores, fw.weights, fw.visible)
    assert inv.convex_combination(fw.output, v, fw.visible, atol=1e-14)
    assert inv.zero_future_mass(fw.weights)


def test_negative_weight_is_found(fw):
    w = fw.weights.copy()
    w[1, 2, 3, 1] = -0.25
    verdict = inv.weights_nonnegative(w, fw.visible)
    assert not verdict and verdict.where == (1, 2, 3, 1) and verdict.amount == 0.25
    assert "(1, 2, 3, 1)" in verdict.message


def test_row_sum_off_is_found_and_empty_rows_not_judged(fw):
    w = fw.weights.copy()
    w[0, 1, 4, :] *= 1.001
    verdict = inv.rows_sum_to_one(w, fw.visible, atol=1e-6)
    assert not verdict and verdict.where == (0, 1, 4)
    assert verdict.amount == pytest.approx(1e-3)
    vis = fw.visible.copy()
    vis[0, 1, 4, :] = False  # an empty row: not judged, whatever it holds
    assert inv.rows_sum_to_one(w, vis, atol=1e-6)
    assert inv.rows_sum_to_one(np.zeros((1, 3)), np.zeros((1, 3), bool)).where is None


def test_post_softmax_masking_breaks_the_row_sum():
    """Seed 000's common mistake: zeroing weights after the softmax."""
    s = np.array([[0.71, 0.5, 0.2], [0.32, 0.67, 0.1], [0.16, 0.15, 0.69]])  # (3, 3)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    w = np.tril(e / e.sum(axis=-1, keepdims=True))  # masked after the softmax
    verdict = inv.rows_sum_to_one(w, atol=1e-9)
    assert not verdict and verdict.where == (0,)


def test_order_violation_names_the_higher_scored_key():
    s = np.array([[3.0, 1.0, 2.0, 0.0]])  # (1, 4)
    w = np.array([[0.4, 0.3, 0.2, 0.1]])  # key 2 (score 2) has less than key 1 (score 1)
    verdict = inv.order_preserved(s, w)
    assert not verdict and verdict.where == (0, 2) and verdict.amount == pytest.approx(0.1)
    assert inv.order_preserved(s, w, atol=0.1 + 1e-12)  # judged with a tolerance
    masked = np.array([[True, False, True, True]])  # key 1 hidden: nothing violates
    assert inv.order_preserved(s, w, masked)


def test_order_ties_may_have_any_weights():
    s = np.array([[1.0, 1.0, 0.0]])
    assert inv.order_preserved(s, np.array([[0.5, 0.3, 0.2]]))
    verdict = inv.order_preserved(s, np.array([[0.5, 0.1, 0.4]]))  # key 1 below a lower score
    assert not verdict and verdict.where == (0, 1) and verdict.amount == pytest.approx(0.3)


def test_order_agrees_with_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(50):
        s = rng.integers(0, 4, size=(3, 6)).astype(float)  # ties on purpose
        w = rng.random((3, 6))
        vis = rng.random((3, 6)) < 0.7
        worst = -np.inf
        for r in range(3):
            for i in range(6):
                for j in range(6):
                    if vis[r, i] and vis[r, j] and s[r, i] < s[r, j]:
                        worst = max(worst, w[r, i] - w[r, j])
        verdict = inv.order_preserved(s, w, vis)
        if worst > 0:
            assert verdict.amount == pytest.approx(worst) and not verdict
        else:
            assert verdict


def test_convex_combination_violation(fw):
    v = fw.problem.value
    out = fw.output.copy()
    top = v[1, 0, :3, 2].max()  # row 2 sees keys 0..2
    out[1, 0, 2, 2] = top + 0.5
    verdict = inv.convex_combination(out, v, fw.visible, atol=1e-12)
    assert not verdict and verdict.where == (1, 0, 2, 2) and verdict.amount == pytest.approx(0.5)
    # the same value would be inside the envelope of *all* rows of V only if hidden rows counted
    assert inv.convex_combination(out, v, fw.visible, atol=0.5 + 1e-9)


def test_convex_combination_broadcasts_and_skips_empty_rows():
    v = np.array([[0.0, 10.0], [10.0, 0.0]])  # (Lk=2, Ev=2)
    out = np.array([[[5.0, 5.0], [99.0, 99.0]]])  # (1, Lq=2, Ev)
    vis = np.array([[True, True], [False, False]])
    assert inv.convex_combination(out, v, vis)


def test_zero_future_mass_exact_and_alignments(fw):
    w = fw.weights.copy()
    w[0, 0, 1, 3] = 1e-300  # tiny is not zero
    verdict = inv.zero_future_mass(w)
    assert not verdict and verdict.where == (0, 0, 1, 3) and verdict.amount == 1e-300
    br = ref.forward(np.ones((2, 4)), np.ones((5, 4)), np.ones((5, 1)),
                     mask=np.tril(np.ones((2, 5), bool), k=3)).weights  # bottom-right, Lq=2, Lk=5
    assert inv.zero_future_mass(br, "bottom_right")
    assert not inv.zero_future_mass(br, "top_left")
    with pytest.raises(ValueError, match="alignment"):
        inv.zero_future_mass(br, "middle")


def test_zero_future_mass_skips_rows_without_a_visible_key():
    w = np.full((4, 2), 0.5)  # bottom-right with Lq > Lk: rows 0, 1 see nothing
    w[2:] = [[1.0, 0.0], [0.5, 0.5]]
    assert inv.zero_future_mass(w, "bottom_right")


def _grads(q, k, v, g, scale):
    return ref.backward(q, k, v, g, is_causal=True, scale=scale)


def test_gradient_scaling_holds_for_the_reference_and_catches_a_missing_scale():
    rng = np.random.default_rng(2)
    q, k, v, g = (rng.normal(size=s) for s in ((2, 5, 4), (2, 6, 4), (2, 6, 3), (2, 5, 3)))
    c, scale = 4.0, 0.5  # powers of two keep q/c, k/c and scale*c^2 exact
    base = _grads(q, k, v, g, scale)
    scaled = _grads(q / c, k / c, v, g, scale * c * c)
    verdict = inv.gradient_scaling(base, scaled, c, atol=1e-12, rtol=1e-12)
    assert verdict, verdict.message
    dq, dk, dv = scaled
    wrong = (dq / (scale * c * c), dk, dv)  # a backward that forgot the scale in dQ
    verdict = inv.gradient_scaling(base, wrong, c, atol=1e-9)
    assert not verdict and verdict.where[0] == "dq" and verdict.amount > 1e-3
    wrong_v = (dq, dk, dv * c)  # dV must not scale
    verdict = inv.gradient_scaling(base, wrong_v, c, atol=1e-9)
    assert not verdict and verdict.where[0] == "dv"
    with pytest.raises(ValueError, match="grads_scaled"):
        inv.gradient_scaling(base, (dq[0], dk, dv), c, atol=0)


def test_dot_product_variance_is_d_sigma4():
    for d, sigma in ((2, 1.0), (64, 1.0), (16, 0.5)):
        r = inv.dot_product_variance(d, sigma, n=50_000, seed=d)
        assert r.predicted == d * sigma**4
        assert abs(r.z) < 5, r  # 5 standard errors of the sample variance
    with pytest.raises(ValueError, match="d >= 1"):
        inv.dot_product_variance(0)


def test_softmax_saturation_entropy_and_max():
    flat = inv.softmax_saturation(np.zeros(4))
    assert flat.entropy_bits == pytest.approx(2.0) and flat.max_weight == pytest.approx(0.25)
    sharp = inv.softmax_saturation(np.array([0.0, 0.0, 100.0, 0.0]))
    assert 0 < sharp.entropy_bits < 1e-38  # 3 * e^-100 * 100/ln2 bits: tiny but not zero
    assert sharp.max_weight == pytest.approx(1.0)


def test_saturation_study_shows_the_seeds_claim():
    """Seed 004: at d=256 unscaled scores saturate the softmax; scaling restores spread."""
    small, big = inv.saturation_study(8, seed=0), inv.saturation_study(256, seed=0)
    assert big.unscaled_max_weight > 0.9 and big.unscaled_entropy_bits < 0.3
    assert big.scaled_entropy_bits > 1.4 and big.scaled_max_weight < 0.6
    # scaled statistics do not depend on d; unscaled ones get worse with d
    assert abs(big.scaled_entropy_bits - small.scaled_entropy_bits) < 0.1
    assert big.unscaled_entropy_bits < small.unscaled_entropy_bits < small.scaled_entropy_bits
    assert big.max_entropy_bits == math.log2(4)


def test_worst_offender_counts_nan_as_infinite_and_skips_unjudged():
    dev = np.array([[0.1, np.nan, 0.3], [5.0, 0.2, 0.0]])
    assert inv.worst_offender(dev) == ((0, 1), np.inf)
    judged = np.array([[True, False, True], [False, True, True]])
    assert inv.worst_offender(dev, judged) == ((0, 2), 0.3)
    assert inv.worst_offender(dev, np.zeros_like(judged)) == (None, 0.0)
    assert inv.worst_offender(np.zeros((0, 3))) == (None, 0.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nan_output_is_printed_as_nan_and_counted_as_infinite(bad):
    """Every invariant's message prints what the output held at its worst entry - nan, not the inf it is
    counted as - in the words a declared NaN deviation matches (backends.declarations.NAN_IN_OUTPUT: a
    library's known NaN, torch-bmm-bf16-nan, failed as ours while two properties printed it as inf)."""
    import re

    from attnspec.backends.declarations import NAN_IN_OUTPUT

    w = np.array([[0.25, 0.75], [0.5, 0.5]])  # (Lq, Lk): row 1 gets the bad weights
    w_bad = w.copy()
    w_bad[1] = bad
    s = np.array([[0.0, 1.0], [0.0, 1.0]])  # (Lq, Lk)
    v = np.array([[1.0], [2.0]])  # (Lk, Ev)
    grads = [np.zeros((2, 2))] * 3
    verdicts = [inv.weights_nonnegative(-w_bad), inv.rows_sum_to_one(w_bad), inv.order_preserved(s, w_bad),
                inv.convex_combination(w_bad[:, :1], v), inv.zero_future_mass(np.array([[1.0, bad], [0.5, 0.5]])),
                inv.rows_sum_to_one(w_bad, atol=np.array([1e-3, 1e-3])),
                inv.gradient_scaling(grads, [w_bad - w] + grads[1:], 2.0, 1e-3)]
    for verdict in verdicts:
        assert not verdict and verdict.amount == np.inf, verdict.message
        assert (re.search(NAN_IN_OUTPUT, verdict.message) is not None) == (bad != bad), verdict.message
        assert ("inf" in verdict.message) == (bad == np.inf), verdict.message


def test_tolerances_may_be_per_row():
    """A per-row budget: each row judged against its own tolerance; where = the row furthest past it."""
    w = np.array([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])  # (Lq, Lk)
    w[0] *= 1.01  # sums to 1.01: within row 0's tolerance 0.02
    w[2] *= 1.001  # sums to 1.001: past row 2's tolerance 1e-4
    verdict = inv.rows_sum_to_one(w, atol=np.array([0.02, 1e-6, 1e-4]))
    assert not verdict and verdict.where == (2,) and verdict.limit == 1e-4
    assert verdict.amount == pytest.approx(1e-3) and verdict.used == pytest.approx(10)
    assert inv.rows_sum_to_one(w, atol=np.array([0.02, 1e-6, 2e-3]))
    s = np.array([[0.0, 1.0], [0.0, 1.0]])  # (Lq, Lk)
    flipped = np.array([[0.55, 0.45], [0.6, 0.4]])  # a near-tie flipped by 0.1 and by 0.2
    verdict = inv.order_preserved(s, flipped, atol=np.array([[0.15], [0.15]]))
    assert not verdict and verdict.where == (1, 1) and verdict.amount == pytest.approx(0.2)
    assert inv.order_preserved(s, flipped, atol=np.array([[0.15], [0.25]]))
