"""FP8 in the definition (issue 31): the formats, the descales, the reference and the budget."""
from __future__ import annotations

import numpy as np
import pytest

from attnspec.specs import error_budget, fp8, reference
from attnspec.specs.plain import Fp8Plain, arithmetic, round_to

ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (a JAX dependency) is the bit-exact yardstick")
FA3 = "float8_e4m3fn(p=float8_e4m3fn,out=bfloat16)"


@pytest.mark.parametrize("name", fp8.FP8_DTYPE_NAMES)
def test_rounding_is_ml_dtypes_bit_for_bit(name):
    """Every code of the format, 200 000 values over 12 decades, ties, overflow, inf and NaN."""
    t = getattr(ml_dtypes, name)
    codes = np.arange(256, dtype=np.uint8).view(t).astype(np.float64)  # every value of the format
    rng = np.random.default_rng(0)
    grid = codes[np.isfinite(codes)]
    mids = (np.sort(grid)[1:] + np.sort(grid)[:-1]) / 2  # ties: where round-to-even decides
    x = np.concatenate([codes, mids, rng.standard_normal(200_000) * 10.0 ** rng.integers(-6, 6, 200_000),
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 465, 480, 57344, 61439, 61440, 1e9]])
    want = x.astype(t).astype(np.float64)
    got = fp8.round_fp8(x, name)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{name}: {x[~same][:5]} -> {got[~same][:5]}, ml_dtypes {want[~same][:5]}"
    assert np.array_equal(np.signbit(got[got == 0]), np.signbit(want[got == 0]))  # -0 stays -0


@pytest.mark.parametrize("name", fp8.FP8_DTYPE_NAMES)
def test_the_formats_list_their_values(name):
    t = getattr(ml_dtypes, name)
    codes = np.arange(256, dtype=np.uint8).view(t).astype(np.float64)
    finite = np.sort(codes[np.isfinite(codes) & (codes > 0)])
    assert np.array_equal(finite, fp8.FP8_FORMATS[name].positives())
    f = fp8.FP8_FORMATS[name]
    assert f.largest == finite[-1] and f.subnormal_min == finite[0] and f.unit_roundoff == 2.0 ** -(f.mantissa + 1)


def test_a_computation_is_named_and_parsed_back():
    c = fp8.Fp8Computation("float8_e5m2", "bfloat16", "float16", query="bfloat16")
    assert fp8.computation(c.name) == c
    assert fp8.computation("float8_e4m3fn") == fp8.Fp8Computation("float8_e4m3fn")
    assert fp8.computation(FA3) == fp8.Fp8Computation("float8_e4m3fn", "float8_e4m3fn", "bfloat16")
    for bad in ("float8_e3m4", "float8_e4m3fn(p=x)", "float16"):
        with pytest.raises(ValueError, match="fp8 format"):
            fp8.computation(bad)


def _qkv(B=2, Hq=4, Hkv=2, Lq=5, Lk=7, E=8, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(fp8.round_fp8(rng.standard_normal(s) * 64, "float8_e4m3fn")
                 for s in ((B, Hq, Lq, E), (B, Hkv, Lk, E), (B, Hkv, Lk, E)))


def test_the_reference_reads_dequantised_values_per_kv_head():
    q, k, v = _qkv()
    dq, dk, dv = (np.array([[0.01, 0.02], [0.03, 0.005]]) * f for f in (1.0, 0.5, 2.0))  # (B, Hkv)
    got = reference.attention(q, k, v, enable_gqa=True, q_descale=dq, k_descale=dk, v_descale=dv)
    qq = q * np.repeat(dq, 2, axis=1)[..., None, None]  # query heads 2g, 2g + 1 share KV head g's
    want = reference.attention(qq, k * dk[..., None, None], v * dv[..., None, None], enable_gqa=True)
    np.testing.assert_array_equal(got, want)
    scalar = reference.attention(q, k, v, enable_gqa=True, k_descale=np.array(0.25))  # one per tensor
    np.testing.assert_array_equal(scalar, reference.attention(q, k * 0.25, v, enable_gqa=True))


@pytest.mark.parametrize("value, match", [
    (np.ones((2, 3)), r"k_descale of shape \(2, 3\) does not broadcast to \(batch..., Hkv\) = \(2, 2\)"),
    (np.array([[1.0, -1.0], [1.0, 1.0]]), "k_descale must be finite and > 0"),
    (np.array([[1.0, np.nan], [1.0, 1.0]]), "k_descale must be finite and > 0"),
    (np.ones((2, 2), dtype=np.int32), "k_descale must be a float array"),
])
def test_a_bad_descale_is_named(value, match):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=match):
        reference.attention(q, k, v, enable_gqa=True, k_descale=value)


def test_descales_have_no_backward():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="forward-only"):
        reference.backward(q, k, v, np.ones(q.shape[:-1] + (8,)), enable_gqa=True, k_descale=np.ones((2, 2)))


def test_the_plain_fp8_computation_rounds_p_and_the_output_only():
    """FA3's computation by hand on one row: P = exp(s - max) rounded to e4m3, divided by the unrounded sum."""
    q = np.array([[[[1.0]]]])  # (1, 1, 1, 1)
    k = np.array([[[[0.0], [-1.0]]]])  # scores 0 and -x
    v = np.array([[[[-1.0], [1.0]]]])
    x = 0.5
    out = error_budget.plain_forward(q, k, v, scale=x, dtype=FA3)[0, 0, 0, 0]
    p = np.exp(-x)
    want = round_to((-1 + round_to(np.float32(p), "float8_e4m3fn")) / np.float32(1 + p), "bfloat16")
    assert out == pytest.approx(float(want), abs=0) and isinstance(arithmetic(FA3), Fp8Plain)
    no_p = error_budget.plain_forward(q, k, v, scale=x, dtype="float8_e4m3fn(p=float32,out=float32)")[0, 0, 0, 0]
    assert no_p == pytest.approx((p - 1) / (1 + p), rel=1e-6)


def _tiled_fp8(q, k, v, scale, dk, block, p_dtype):
    """An FA3-style kernel written here: blocks of keys, P of each block rounded before P V."""
    s = (q @ np.swapaxes(k, -1, -2)).astype(np.float32) * np.float32(scale * dk)  # (..., Lq, Lk)
    m = np.full(s.shape[:-1] + (1,), -np.inf, np.float32)
    l_sum = np.zeros_like(m)
    acc = np.zeros(s.shape[:-1] + v.shape[-1:], np.float32)
    for j in range(0, s.shape[-1], block):
        b = s[..., j:j + block]
        m_new = np.maximum(m, b.max(axis=-1, keepdims=True))
        p = np.exp(b - m_new).astype(np.float32)
        alpha = np.exp(m - m_new)
        l_sum = l_sum * alpha + p.sum(axis=-1, keepdims=True)
        acc = acc * alpha + round_to(p, p_dtype).astype(np.float32) @ v[..., j:j + block, :].astype(np.float32)
        m = m_new
    return round_to(acc / l_sum, "bfloat16")


@pytest.mark.parametrize("p_dtype", fp8.FP8_DTYPE_NAMES)
def test_the_budget_holds_a_tiled_kernels_other_roundings(p_dtype):
    """A kernel rounding P against its running maximum (another set of roundings than the plain
    computation's global one) stays within the budget - every row, 40 problems with rows from near
    uniform to saturated - and a gain of 2 u_p on its output does not."""
    name = f"float8_e4m3fn(p={p_dtype},out=bfloat16)"
    worst = 0.0
    for seed in range(40):
        q, k, v = _qkv(B=1, Hq=2, Hkv=2, Lq=6, Lk=40, seed=seed)
        dk = 2.0 ** (seed % 8 - 12)  # scores from ~0.1 (near uniform) to ~1e2 (saturated)
        got = _tiled_fp8(q, k, v, 1 / np.sqrt(8), dk, 1 + seed % 9, p_dtype)
        allowed, ref, _ = error_budget.forward_allowed_rows(q, k, v, dtype=name, k_descale=np.array(dk))
        worst = max(worst, float(np.max(np.abs(got - ref).max(axis=-1) / allowed)))
    assert 0.05 < worst <= 1.0, worst  # used, never exceeded
    u_p = fp8.FP8_FORMATS[p_dtype].unit_roundoff
    q, k, v = _qkv(B=1, Hq=2, Hkv=2, Lq=6, Lk=40, seed=3)
    bad = _tiled_fp8(q, k, v, 1 / np.sqrt(8), 2.0**-9, 4, p_dtype) * (1 + 8 * u_p)
    assert not error_budget.check_forward(bad, q, k, v, dtype=name, k_descale=np.array(2.0**-9))
