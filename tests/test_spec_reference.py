"""attnspec.specs.reference: stability, empty rows, lse, broadcasting, and the analytic backward."""
import numpy as np
import pytest

from attnspec.specs import reference as ref


def rand(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s) for s in shapes]


def test_seed_000_example_by_hand():
    q = np.array([[1.0, 0.0]])  # (1, 2)
    k = np.array([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1]])  # (3, 2)
    v = np.array([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]])  # (3, 2)
    fw = ref.forward(q, k, v)
    s = np.array([1.0, 0.0, 0.9]) / np.sqrt(2)
    w = np.exp(s) / np.exp(s).sum()
    np.testing.assert_allclose(fw.scores[0], s, rtol=1e-15)
    np.testing.assert_allclose(fw.weights[0], w, rtol=1e-15)
    np.testing.assert_allclose(fw.output[0], w @ v, rtol=1e-15)


@pytest.mark.parametrize("big", [1e4, -1e4, 1e300])
def test_stable_at_huge_scores(big):
    q = np.array([[1.0]])  # (1, 1) with scale 1: the scores are k itself
    k = np.array([[big], [big - 1.0], [-big]])  # (3, 1)
    v = np.array([[1.0], [2.0], [3.0]])  # (3, 1)
    fw = ref.forward(q, k, v, scale=1.0)
    assert np.all(np.isfinite(fw.weights)) and np.all(np.isfinite(fw.output)) and np.isfinite(fw.lse).all()
    np.testing.assert_allclose(fw.weights.sum(), 1.0, rtol=1e-15)
    if big == 1e4:  # two keys within 1 of each other, the third 2e4 below
        np.testing.assert_allclose(fw.weights[0, :2], [1 / (1 + np.exp(-1)), np.exp(-1) / (1 + np.exp(-1))])
        assert fw.weights[0, 2] == 0.0
        np.testing.assert_allclose(fw.lse[0], 1e4 + np.log1p(np.exp(-1.0)), rtol=1e-15)


def test_fully_masked_rows_are_zeros_and_lse_minus_inf():
    q, k, v, g = rand(1, (2, 3, 4), (2, 5, 4), (2, 5, 6), (2, 3, 6))
    mask = np.ones((2, 3, 5), bool)
    mask[1, 2] = False  # batch 1, row 2 sees nothing
    fw = ref.forward(q, k, v, mask=mask)
    assert np.all(fw.weights[1, 2] == 0) and np.all(fw.output[1, 2] == 0) and fw.lse[1, 2] == -np.inf
    assert fw.empty_rows.tolist() == [[False] * 3, [False, False, True]]
    dq, dk, dv = ref.backward(q, k, v, g, mask=mask)
    assert np.all(dq[1, 2] == 0) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))


def test_lse_is_logsumexp_of_visible_scores():
    q, k, v = rand(2, (3, 4, 8), (3, 6, 8), (3, 6, 2))
    fw = ref.forward(q, k, v, is_causal=True)
    s = np.where(fw.visible, fw.scores, -np.inf)
    expected = np.log(np.exp(s).sum(axis=-1))  # scores are O(1): the naive formula is exact enough
    np.testing.assert_allclose(fw.lse, expected, rtol=1e-14)
    np.testing.assert_allclose(fw.weights, np.exp(s - fw.lse[..., None]), rtol=1e-13, atol=1e-300)


def test_leading_dims_broadcast_like_a_loop():
    q, k, v = rand(3, (2, 1, 3, 4), (1, 5, 6, 4), (2, 5, 6, 3))  # batch (2, 5)
    mask = np.random.default_rng(3).random((5, 3, 6)) < 0.8
    out = ref.attention(q, k, v, mask=mask)
    assert out.shape == (2, 5, 3, 3)
    for b in range(2):
        for h in range(5):
            np.testing.assert_allclose(out[b, h], ref.attention(q[b, 0], k[0, h], v[b, h], mask=mask[h]),
                                       rtol=1e-14, atol=1e-15)


def _loss(q, k, v, g, **kw):
    return float((ref.attention(q, k, v, **kw) * g).sum())


@pytest.mark.parametrize("kw", [dict(), dict(is_causal=True), dict(scale=0.7, is_causal=True)])
def test_backward_matches_central_finite_differences(kw):
    """Broadcast leading dims included: k is shared across heads, its gradient summed."""
    q, k, v, g = rand(4, (2, 3, 4, 3), (2, 1, 5, 3), (2, 3, 5, 2), (2, 3, 4, 2))
    mask = np.random.default_rng(4).random((4, 5)) < 0.8
    mask[:, 0] = True
    kw = dict(kw, mask=mask)
    analytic = ref.backward(q, k, v, g, **kw)
    h = 1e-5  # central differences: truncation ~h^2 = 1e-10, rounding ~1e-16/h = 1e-11
    for x, grad, name in zip((q, k, v), analytic, "qkv", strict=True):
        assert grad.shape == x.shape
        fd = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            x[i] += h
            up = _loss(q, k, v, g, **kw)
            x[i] -= 2 * h
            down = _loss(q, k, v, g, **kw)
            x[i] += h
            fd[i] = (up - down) / (2 * h)
        rel = np.abs(fd - grad).max() / np.abs(grad).max()
        assert rel <= 1e-7, f"d{name}: relative error {rel:.2e}"


def test_masked_softmax_directly():
    s = np.array([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]])  # (2, 3)
    vis = np.array([[True, False, True], [False, False, False]])
    w, lse = ref.masked_softmax(s, vis)
    np.testing.assert_allclose(w[0], [1 / (1 + np.e**2), 0, np.e**2 / (1 + np.e**2)])
    assert np.all(w[1] == 0) and lse[1] == -np.inf
