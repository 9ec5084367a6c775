"""attnspec.specs.problem: every bad input gets a ValueError naming the argument and what was wrong."""
import math

import numpy as np
import pytest

from attnspec.specs import problem as P


def qkv(Lq=3, Lk=4, E=5, Ev=2, batch=(2,), dtype=np.float64):
    return (np.zeros(batch + (Lq, E), dtype), np.zeros(batch + (Lk, E), dtype),
            np.zeros(batch + (Lk, Ev), dtype))


def test_valid_problem_resolves_shapes_and_default_scale():
    q, k, v = qkv()
    p = P.validate(q[None], k[:, None], v)  # (1, 2, ...) with (2, 1, ...) and (2, ...)
    assert p.batch_shape == (2, 2) and (p.Lq, p.Lk, p.E, p.Ev) == (3, 4, 5, 2)
    assert p.scale == 1 / math.sqrt(5) == P.default_scale(5)
    assert P.validate(q, k, v, scale=np.float32(0.5)).scale == 0.5


def test_embedding_dims_differ():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"query and key .* query \(2, 3, 5\) \(E=5\) and key \(2, 4, 6\) \(E=6\)"):
        P.validate(q, np.zeros((2, 4, 6)), v)


def test_key_value_lengths_differ():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"key and value .* key \(2, 4, 5\) \(Lk=4\) and value \(2, 7, 2\) \(Lk=7\)"):
        P.validate(q, k, np.zeros((2, 7, 2)))


@pytest.mark.parametrize("which", ["query", "key", "value"])
@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.complex128])
def test_non_floating_dtype(which, dtype):
    args = dict(zip(("query", "key", "value"), qkv(), strict=True))
    args[which] = args[which].astype(dtype)
    with pytest.raises(ValueError, match=rf"{which} must have a floating dtype; got {np.dtype(dtype).name}"):
        P.validate(**args)


@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_rank_below_two(which):
    args = dict(zip(("query", "key", "value"), qkv(), strict=True))
    args[which] = np.zeros(3)
    with pytest.raises(ValueError, match=rf"{which} must be an array of rank >= 2.*\(3,\)"):
        P.validate(**args)


def test_mask_not_boolean():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="mask must be boolean.*float64"):
        P.validate(q, k, v, mask=np.ones((3, 4)))
    with pytest.raises(ValueError, match="mask must be boolean.*int64"):
        P.validate(q, k, v, mask=np.ones((3, 4), dtype=np.int64))


@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (3, 2, 3, 4), (5, 3, 4)])
def test_mask_not_broadcastable(shape):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=rf"mask of shape \({shape[0]}, .*not broadcastable to .*\(2, 3, 4\)"):
        P.validate(q, k, v, mask=np.ones(shape, dtype=bool))


@pytest.mark.parametrize("scale", [0.0, -1.0, math.inf, -math.inf, math.nan, "0.5", True, 1j])
def test_scale_not_finite_positive(scale):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="scale must be a finite positive number; got"):
        P.validate(q, k, v, scale=scale)


@pytest.mark.parametrize("dim,name", [("E", "E"), ("Ev", "Ev")])
def test_zero_head_dims(dim, name):
    sizes = dict(Lq=3, Lk=4, E=5, Ev=2)
    sizes[dim] = 0
    with pytest.raises(ValueError, match=rf"{name} \(.*\) must be positive; got 0"):
        P.validate(*qkv(**sizes))


@pytest.mark.parametrize("sizes", [dict(Lq=0), dict(Lk=0), dict(batch=(0,))])
def test_zero_lengths_and_batches_are_problems(sizes):
    """PyTorch accepts them (empty outputs; Lk = 0 gives rows with nothing to see)."""
    p = P.validate(*qkv(**sizes))
    assert P.visible(p).shape == p.batch_shape + (p.Lq, p.Lk)


def test_batch_dims_do_not_broadcast():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"leading .* query \(2, 3, 5\), key \(3, 4, 5\)"):
        P.validate(q, np.zeros((3, 4, 5)), np.zeros((3, 4, 2)))


def test_is_causal_must_be_bool():
    with pytest.raises(ValueError, match="is_causal must be a bool; got 1"):
        P.validate(*qkv(), is_causal=1)


def test_causal_mask_alignments():
    tl = P.causal_mask(2, 4)
    assert tl.tolist() == [[True, False, False, False], [True, True, False, False]]
    br = P.causal_mask(2, 4, "bottom_right")
    assert br.tolist() == [[True, True, True, False], [True, True, True, True]]
    with pytest.raises(ValueError, match="alignment must be"):
        P.causal_mask(2, 2, "diagonal")


def test_visible_combines_mask_and_causal():
    q, k, v = qkv(Lq=3, Lk=3)
    mask = np.array([True, False, True])  # hides key 1 everywhere
    vis = P.visible(P.validate(q, k, v, mask=mask, is_causal=True))
    assert vis.shape == (2, 3, 3)
    assert vis[0].tolist() == [[True, False, False], [True, False, False], [True, False, True]]


def test_a_python_bool_is_not_a_mask():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"mask must be a boolean array .* got bool True .*is_causal=True"):
        P.validate(q, k, v, True)


def test_alibi_slopes_reach_float64_backends_exactly():
    """16 heads: the slopes 2^(-h/2) are not float32 numbers; a float64 call must get them exactly."""
    from attnspec.backends.registry import resolve
    from attnspec.specs import error_budget
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 16, 8, 8)), rng.standard_normal((1, 16, 40, 8)), rng.standard_normal((1, 16, 40, 8))
    slopes = P.alibi_slopes(16)
    out = resolve("numpy-naive").forward(q, k, v, dtype="float64", alibi_slopes=slopes)
    assert error_budget.check_forward(out, q, k, v, dtype="float64", alibi_slopes=slopes)
