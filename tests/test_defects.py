"""tests/defects.py: each graded defect is torch-math at d = 0 and exactly its defect above it."""
from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("torch", reason="the defects are built on torch-math")

from attnspec.backends.registry import BackendSelectionError, resolve  # noqa: E402
from attnspec.specs import error_budget as eb  # noqa: E402
from tests import defects as D  # noqa: E402


def _qkv(Lq=5, Lk=40, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((2, 3, Lq, 8)), rng.standard_normal((2, 3, Lk, 8)),
            rng.standard_normal((2, 3, Lk, 8)))  # (B, H, L, E)


@pytest.mark.parametrize("dtype", D.DTYPES)
@pytest.mark.parametrize("kind", D.DEFECTS)
def test_d_zero_is_torch_math_bit_for_bit(kind, dtype):
    q, k, v = _qkv()
    g = np.random.default_rng(1).standard_normal((2, 3, 5, 8))  # (B, H, Lq, Ev)
    tm, zero = resolve("torch-math"), D.make(kind, 0, dtype)
    mask = np.random.default_rng(2).random((5, 40)) < 0.7  # (Lq, Lk)
    for kw in (dict(is_causal=True), dict(mask=mask), dict(return_lse=True)):
        a, b = zero.forward(q, k, v, dtype=dtype, **kw), tm.forward(q, k, v, dtype=dtype, **kw)
        for x, y in zip(*(((a,), (b,)) if not isinstance(a, tuple) else (a, b)), strict=True):
            np.testing.assert_array_equal(x, y)
    for x, y in zip(zero.backward(q, k, v, g, dtype=dtype), tm.backward(q, k, v, g, dtype=dtype), strict=True):
        np.testing.assert_array_equal(x, y)


def test_each_defect_is_what_its_name_says():
    q, k, v = _qkv(Lk=12)  # one 16-key block: tail drops a fraction d of everything
    d, dt = 1e-3, "float64"
    tm = resolve("torch-math")
    out = tm.forward(q, k, v, dtype=dt)
    np.testing.assert_allclose(D.make("gain", d).forward(q, k, v, dtype=dt), out * (1 + d), rtol=1e-14)
    np.testing.assert_allclose(D.make("temperature", d).forward(q, k, v, scale=0.5, dtype=dt),
                               tm.forward(q, k, v, scale=0.5 * (1 + d), dtype=dt), rtol=1e-14)
    np.testing.assert_allclose(D.make("tail", d).forward(q, k, v, dtype=dt), out / (1 - d), rtol=1e-13)
    np.testing.assert_allclose(D.make("rescale", d).forward(q, k, v, dtype=dt), out, rtol=1e-14)  # one block
    _, lse = tm.forward(q, k, v, dtype=dt, return_lse=True)
    _, lse_tail = D.make("tail", d).forward(q, k, v, dtype=dt, return_lse=True)
    np.testing.assert_allclose(lse_tail, lse + math.log(1 - d), rtol=1e-13)


def test_rescale_shows_only_when_a_later_block_raises_the_maximum():
    q, k, v = _qkv(Lq=1, Lk=32)
    k = np.abs(k) * np.where(np.arange(32) < 16, 0.1, 1.0)[:, None]  # (.., 32, E) the max sits in block 2
    q = np.abs(q)
    out = resolve("torch-math").forward(q, k, v, dtype="float64")
    late = D.make("rescale", 1e-2).forward(q, k, v, dtype="float64")
    kr, vr = k[..., ::-1, :], v[..., ::-1, :]  # the same keys, the largest scores first
    early = D.make("rescale", 1e-2).forward(q, kr, vr, dtype="float64")
    assert np.abs(late - out).max() > 1e-5 * np.abs(out).max()
    # max in the first block: the running sum is never rescaled, the defect never acts
    np.testing.assert_allclose(early, resolve("torch-math").forward(q, kr, vr, dtype="float64"), rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_large_defects_fail_the_budget_and_tiny_ones_in_16_bit_vanish(dtype):
    q, k, v = (eb.round_to(x, dtype).astype(np.float64) for x in _qkv(Lk=9))
    for kind in ("temperature", "gain", "tail"):
        out = D.make(kind, 0.1).forward(q, k, v, dtype=dtype)
        assert not eb.check_forward(out, q, k, v, dtype=dtype), (kind, dtype)
    if dtype in ("float16", "bfloat16"):  # below half an ulp, out * (1 + d) rounds back to out
        same = D.make("gain", 1e-5).forward(q, k, v, dtype=dtype)
        np.testing.assert_array_equal(same, resolve("torch-math").forward(q, k, v, dtype=dtype))


def test_names_resolve_and_bad_names_say_why():
    b = resolve("tests.defects:gain_3e-3_bfloat16")
    assert (b.kind, b.d, b.capabilities.dtypes, b.name) == ("gain", 3e-3, ("bfloat16",), "defect-gain-0.003-bfloat16")
    assert resolve(D.spec("tail", 1.5e-3)).d == 1.5e-3 and D.spec("tail", 1.5e-3) == "tests.defects:tail_15e-4"
    assert resolve(D.spec("rescale", 0, "float16")).capabilities.dtypes == ("float16",)
    with pytest.raises(BackendSelectionError, match="gain_big"):
        resolve("tests.defects:gain_big")
    with pytest.raises(AttributeError, match="e.g. gain_3e-3_float16"):
        D.gain_big  # noqa: B018
    with pytest.raises(ValueError, match="d must be"):
        D.make("gain", 1.5)
    with pytest.raises(ValueError, match="kind must be"):
        D.make("bias", 0.1)
