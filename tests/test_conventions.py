"""Issue 31's declarations and entry points: bad values are ValueErrors naming the argument; a declared
base-2 LSE comes back natural; the merge entry points of numpy-naive and torch-math meet the reference."""
from __future__ import annotations

import numpy as np
import pytest

from attnspec.backends.base import Semantics, Unsupported
from attnspec.backends.registry import resolve
from attnspec.specs import reference
from attnspec.specs.merge_budget import merge_allowed


@pytest.mark.parametrize("name, value", [("lse_base", "10"), ("empty_lse", "nan"), ("empty_lse", "-inf ")])
def test_semantics_refuses_unknown_conventions(name, value):
    with pytest.raises(ValueError, match=f"Semantics.{name}"):
        Semantics(**{name: value})


def test_unknown_knob_is_a_value_error_naming_it():
    q = np.ones((1, 1, 2, 4))
    with pytest.raises(ValueError, match="knobs: numpy-tiled has no knob"):
        resolve("numpy-tiled").forward(q, q, q, knobs={"num_splits": 2})
    with pytest.raises(ValueError, match="knobs: numpy-naive has no knob"):
        resolve("numpy-naive").forward(q, q, q, knobs={"block_size": 16})


def test_merge_shapes_are_checked_and_default_is_not_offered():
    o, lse = np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3))
    with pytest.raises(ValueError, match="merge: o_a, o_b"):
        resolve("numpy-naive").merge(o, lse, o, lse[..., :2])
    with pytest.raises(Unsupported, match="offers no merge"):
        resolve("numpy-tiled").merge(o, lse, o, lse)


@pytest.mark.parametrize("name", ["numpy-naive", "torch-math"])
def test_builtin_merges_meet_the_reference_and_keep_empty_exact(name):
    backend = resolve(name)
    backend.load()
    rng = np.random.default_rng(0)
    o_a, o_b = rng.standard_normal((2, 1, 2, 3, 4))  # each (B, H, Lq, Ev)
    lse_a = np.array([[[0.5, 1e4, -np.inf]] * 2])  # (B, H, Lq): alike, a huge gap, both empty
    lse_b = np.array([[[0.25, 0.0, -np.inf]] * 2])
    o_a[..., 2, :] = o_b[..., 2, :] = 0.0
    o, lse = backend.merge(o_a, lse_a, o_b, lse_b, "float64")
    want_o, want_lse = reference.merge([(o_a, lse_a), (o_b, lse_b)])
    o_tol, l_tol = merge_allowed([(o_a, lse_a), (o_b, lse_b)], "float64")
    assert np.all(np.abs(o - want_o)[..., :2, :] <= o_tol[..., :2, :])
    assert np.all(np.abs(lse - want_lse)[..., :2] <= l_tol[..., :2])
    assert np.all(o[..., 2, :] == 0) and np.all(lse[..., 2] == -np.inf)  # flashinfer#4051: not NaN


def test_declared_base_two_comes_back_natural():
    from tests.broken.correct import LseBase2Declared
    rng = np.random.default_rng(1)
    q, k, v = np.round(rng.standard_normal((3, 1, 2, 4, 8)) * 8) / 8  # exact in bfloat16
    _, lse = LseBase2Declared().forward(q, k, v, dtype="bfloat16", return_lse=True)
    # computed in float32 (the kernel widens bfloat16): a few float32 roundings of an LSE near 1
    np.testing.assert_allclose(lse, reference.forward(q, k, v).lse, rtol=2.0**-20)
