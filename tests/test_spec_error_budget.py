"""The error budget accepts correct kernels and rejects real bugs, both measured."""
import functools

import numpy as np
import pytest

from attnspec.specs import error_budget as eb
from attnspec.specs import reference as ref
from attnspec.specs.problem import validate, visible
from tests._helpers import qkv

DTYPES = ("float16", "bfloat16", "float32", "float64")


def tiled_forward(q, k, v, mask=None, is_causal=False, scale=None, dtype="float16", block=8,
                  forget_rescale=False):
    """An online-softmax (flash-style) kernel emulated in dtype: inputs and P rounded to
    dtype, scores and accumulators in the accumulator type, one key tile at a time."""
    p = validate(q, k, v, mask, is_causal, scale)
    vis = visible(p)  # (..., Lq, Lk)
    acc_t = np.float64 if dtype == "float64" else np.float32
    qr, kr, vr = (eb.round_to(x, dtype).astype(acc_t) for x in (q, k, v))
    m = np.full(vis.shape[:-1] + (1,), -np.inf, acc_t)  # (..., Lq, 1) running max
    row_sum = np.zeros_like(m)  # (..., Lq, 1) running sum of exponentials
    acc = np.zeros(vis.shape[:-1] + (vr.shape[-1],), acc_t)  # (..., Lq, Ev)
    for j in range(0, p.Lk, block):
        s = (qr @ np.swapaxes(kr[..., j:j + block, :], -1, -2)) * acc_t(p.scale)  # (..., Lq, b)
        s = np.where(vis[..., j:j + block], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))  # (..., Lq, 1)
        safe = np.where(np.isfinite(m_new), m_new, 0.0)
        pt = eb.round_to(np.exp(s - safe), dtype).astype(acc_t)  # (..., Lq, b) P in dtype, as flash keeps it
        alpha = np.exp(np.where(np.isfinite(m), m, safe) - safe).astype(acc_t)  # (..., Lq, 1)
        if forget_rescale:  # the classic online-softmax bug
            alpha = np.ones_like(alpha)
        row_sum = row_sum * alpha + pt.sum(axis=-1, keepdims=True)
        acc = acc * alpha + pt @ vr[..., j:j + block, :]  # (..., Lq, Ev)
        m = m_new
    return eb.round_to(acc / np.where(row_sum == 0, 1.0, row_sum), dtype)  # (..., Lq, Ev)


# this module's problem: (B, H) = (2, 3), Lq 24, Lk 40, E 16, Ev 8 unless a test says otherwise
_problem = functools.partial(qkv, batch=(2, 3), Lq=24, Lk=40, E=16, Ev=8)


def test_budget_table_is_the_documented_one():
    """The module docstring's table and BUDGETS say the same thing."""
    rows = {}
    for line in eb.__doc__.splitlines():
        parts = line.split()
        if parts and parts[0] in DTYPES and len(parts) >= 10:
            rows[parts[0]] = parts
    assert set(rows) == set(DTYPES)
    for name, parts in rows.items():
        b = eb.BUDGETS[name]
        assert b.unit_roundoff == 2.0 ** float(parts[1].replace("2^", ""))
        assert b.accumulate_roundoff == 2.0 ** float(parts[4].replace("2^", ""))
        assert (b.factor, b.floor_ulps) == (float(parts[7]), float(parts[8]))
        assert b.normal_min == 2.0 ** float(parts[9].replace("2^", ""))


def test_bfloat16_rounding_is_round_to_nearest_even():
    one = np.float32(1.0)
    ulp = 2.0**-7  # bfloat16 spacing at 1
    assert eb.round_bfloat16(one + np.float32(ulp / 2)) == one  # tie -> even (1.0)
    assert eb.round_bfloat16(np.float32(1 + 3 * ulp / 2)) == np.float32(1 + 2 * ulp)  # tie -> even
    assert eb.round_bfloat16(np.float32(1 + ulp * 0.51)) == np.float32(1 + ulp)
    assert np.isinf(eb.round_bfloat16(np.float32(3.4e38)))  # beyond bf16's max: overflows
    assert np.isnan(eb.round_bfloat16(np.float32("nan")))
    x = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    r = eb.round_bfloat16(x)
    assert np.all(r.view(np.uint32) & 0xFFFF == 0)
    assert np.all(np.abs(r - x) <= 2.0**-8 * np.abs(x))  # within u of bfloat16


@pytest.mark.parametrize("dtype", DTYPES)
def test_plain_error_is_of_the_order_of_the_unit_roundoff(dtype):
    q, k, v = _problem(1)
    err = np.abs(eb.plain_forward(q, k, v, dtype=dtype).astype(np.float64) - ref.attention(q, k, v)).max()
    u = eb.BUDGETS[dtype].unit_roundoff
    assert err <= 20 * u  # |V| ~ 1: a handful of roundings, never more
    if dtype != "float64":
        assert err >= u / 100  # and it really was rounded to dtype


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_causal", [False, True])
def test_correct_tiled_kernel_passes(dtype, is_causal):
    for seed in range(3):
        q, k, v = _problem(seed, sigma=[0.5, 1.0, 2.0][seed])
        out = tiled_forward(q, k, v, is_causal=is_causal, dtype=dtype)
        verdict = eb.check_forward(out, q, k, v, is_causal=is_causal, dtype=dtype)
        assert verdict, verdict.message


@pytest.mark.parametrize("dtype", DTYPES)
def test_plain_computation_itself_passes(dtype):
    q, k, v = _problem(3)
    g = np.random.default_rng(3).normal(size=(2, 3, 24, 8))  # (B, H, Lq, Ev)
    assert eb.check_forward(eb.plain_forward(q, k, v, dtype=dtype), q, k, v, dtype=dtype)
    for verdict in eb.check_backward(eb.plain_backward(q, k, v, g, dtype=dtype), q, k, v, g, dtype=dtype):
        assert verdict, verdict.message


@pytest.mark.parametrize("dtype", DTYPES)
def test_bugs_are_rejected(dtype):
    q, k, v = _problem(4, Lq=12, Lk=12)
    E = q.shape[-1]
    bugs = {
        "forgot the online rescale": tiled_forward(q, k, v, dtype=dtype, block=4, forget_rescale=True),
        "scale 1/E instead of 1/sqrt(E)": tiled_forward(q, k, v, scale=1.0 / E, dtype=dtype),
        "scale doubled": tiled_forward(q, k, v, scale=2.0 / np.sqrt(E), dtype=dtype),
    }
    for what, out in bugs.items():
        verdict = eb.check_forward(out, q, k, v, dtype=dtype)
        assert not verdict, f"{what} accepted in {dtype}: {verdict.message}"
        assert verdict.amount > 0 and verdict.where is not None


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_mask_off_by_one_is_rejected(dtype):
    q, k, v = _problem(5, Lq=12, Lk=12)
    shifted = np.tril(np.ones((12, 12), dtype=bool), k=1)  # sees one future key
    out = tiled_forward(q, k, v, mask=shifted, dtype=dtype)
    verdict = eb.check_forward(out, q, k, v, is_causal=True, dtype=dtype)
    assert not verdict, verdict.message
    assert verdict.where[-2] < 11  # the last row has no future key to leak: never the worst


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_perturbation_beyond_the_budget_fails_and_within_passes(dtype):
    q, k, v = _problem(6)
    r = ref.attention(q, k, v)
    plain = eb.plain_forward(q, k, v, dtype=dtype)
    n = eb.reduction_length(q.shape, k.shape, v.shape)
    mag = eb.forward_magnitude(q, k, v)
    allowed = eb.allowed_error(r, plain, dtype, n, mag)
    bumped = r.copy()
    bumped[1, 2, 3, 4] += 1.01 * allowed
    verdict = eb.check_close(bumped, r, plain, dtype, "output", n, mag)
    assert not verdict and verdict.where == (1, 2, 3, 4)
    assert verdict.amount == pytest.approx(1.01 * allowed)
    bumped[1, 2, 3, 4] = r[1, 2, 3, 4] + 0.99 * allowed
    assert eb.check_close(bumped, r, plain, dtype, "output", n, mag)


def test_nan_fails_and_names_its_place():
    q, k, v = _problem(7)
    r = ref.attention(q, k, v)
    bad = r.copy()
    bad[0, 1, 2, 3] = np.nan
    verdict = eb.check_close(bad, r, eb.plain_forward(q, k, v, dtype="float32"), "float32")
    assert not verdict and verdict.where == (0, 1, 2, 3) and verdict.amount == np.inf


def test_backward_bug_is_rejected():
    q, k, v = _problem(8, Lq=10, Lk=10)
    g = np.random.default_rng(8).normal(size=(2, 3, 10, 8))  # (B, H, Lq, Ev)
    dq, dk, dv = ref.backward(q, k, v, g)
    unscaled = (dq / (1 / np.sqrt(16)), dk, dv)  # "forgot the scale in dQ" (seed 003)
    verdicts = eb.check_backward(unscaled, q, k, v, g, dtype="float16")
    assert [bool(x) for x in verdicts] == [False, True, True]


def test_bad_arguments_name_themselves():
    r = np.zeros((2, 3))
    with pytest.raises(ValueError, match="dtype"):
        eb.allowed_error(r, r, "int8")
    with pytest.raises(ValueError, match=r"plain has shape \(3,\)"):
        eb.allowed_error(r, np.zeros(3), "float32")
    with pytest.raises(ValueError, match=r"actual output has shape \(2, 2\)"):
        eb.check_close(np.zeros((2, 2)), r, r, "float32")
    with pytest.raises(ValueError, match="reduction_length"):
        eb.allowed_error(r, r, "float32", reduction_length=0)
    with pytest.raises(ValueError, match="overflows"):
        eb.allowed_error(r, np.full((2, 3), np.inf), "float16")


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_sdpa_on_cpu_is_within_budget(dtype):
    """A real fused kernel (PyTorch's CPU flash/math SDPA) forward and backward."""
    torch = pytest.importorskip("torch", reason="torch not installed")
    F = torch.nn.functional
    native = getattr(torch, dtype)
    for seed, is_causal in ((0, False), (1, True)):
        q, k, v = _problem(seed, Lq=33, Lk=70, E=16, Ev=8)
        g = np.random.default_rng(seed).normal(size=(2, 3, 33, 8))  # (B, H, Lq, Ev)
        tq, tk, tv = (torch.tensor(x).to(native).requires_grad_() for x in (q, k, v))
        out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=is_causal)  # (B, H, Lq, Ev)
        out.backward(torch.tensor(g).to(native))
        as_np = lambda t: t.detach().to(torch.float64).numpy()  # noqa: E731
        verdict = eb.check_forward(as_np(out), q, k, v, is_causal=is_causal, dtype=dtype)
        assert verdict, verdict.message
        grads = [as_np(t.grad) for t in (tq, tk, tv)]
        for verdict in eb.check_backward(grads, q, k, v, g, is_causal=is_causal, dtype=dtype):
            assert verdict, verdict.message


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cancelling_gradients_are_judged_by_their_terms(dtype):
    """Equal rows of V make dS = A (dA - rowsum(dA A)) cancel to ~0; a correct kernel that sums
    in another order (here: keys reversed) leaves rounding dust the size of the terms."""
    q, k, v = _problem(9, Lq=16, Lk=48)
    v = np.broadcast_to(v[..., :1, :], v.shape).copy()  # (B, H, Lk, Ev) every row the same
    g = np.random.default_rng(9).normal(size=(2, 3, 16, 8))  # (B, H, Lq, Ev)
    flip = slice(None, None, -1)
    dq, dk, dv = eb.plain_backward(q, k[..., flip, :], v[..., flip, :], g, dtype=dtype)
    reordered = (dq, dk[..., flip, :], dv[..., flip, :])
    for verdict in eb.check_backward(reordered, q, k, v, g, dtype=dtype):
        assert verdict, verdict.message


def test_forward_allowed_restricts_to_judged_rows():
    q, k, v = _problem(10, Lq=6, Lk=6)
    mask = np.ones((6, 6), dtype=bool)
    mask[2] = False  # row 2 sees nothing: not judged
    rows = np.broadcast_to(mask.any(axis=-1), (2, 3, 6))  # (B, H, Lq)
    allowed, r, p = eb.forward_allowed(q, k, v, mask, dtype="float16", rows=rows)
    assert r.shape == p.shape == (2 * 3 * 5, 8) and allowed > 0
    out = eb.plain_forward(q, k, v, mask, dtype="float16").astype(np.float64)
    out[:, :, 2] = np.nan  # whatever a backend does with an empty row
    assert eb.check_forward(out, q, k, v, mask, dtype="float16", rows=rows)
    assert not eb.check_forward(out, q, k, v, mask, dtype="float16")


# ---- row budgets -------------------------------------------------------------------------

def _saturated_and_plain(dtype, seed=11):
    """Row 0 of every head saturated (scores ~ 60), the other rows ordinary (scores ~ 1)."""
    q, k, v = (eb.round_to(x, dtype).astype(np.float64) for x in _problem(seed, Lq=8, Lk=24))
    q[..., 0, :] *= 16.0  # exact: a power of two
    return q, k, v


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_saturated_row_does_not_loosen_the_others(dtype):
    """Each row's allowance comes from its own scores: a tensor-wide allowance (the largest row's,
    as the old floor) would let a slip in an ordinary row through; the row budget does not."""
    q, k, v = _saturated_and_plain(dtype)
    allowed, r, plain = eb.forward_allowed_rows(q, k, v, dtype=dtype)
    assert allowed.shape == r.shape[:-1] == (2, 3, 8)
    slip = 2 * allowed[..., 1:].max()  # twice the largest ordinary row's allowance
    assert slip < allowed[..., 0].max()  # the saturated rows need more: a tensor-wide budget accepts it
    bumped = eb.plain_forward(q, k, v, dtype=dtype).astype(np.float64)
    bumped[1, 2, 5, :] += slip
    verdict = eb.check_forward(bumped, q, k, v, dtype=dtype)
    assert not verdict and verdict.where[:3] == (1, 2, 5), verdict.message
    assert "row (1, 2, 5)" in verdict.message and verdict.used > 1 and verdict.limit == pytest.approx(allowed[1, 2, 5])


def test_verdict_names_the_row_and_the_margin():
    q, k, v = _problem(12, Lq=6, Lk=9)
    allowed, r, _ = eb.forward_allowed_rows(q, k, v, dtype="float32")
    out = r.copy()
    out[0, 1, 4, 2] += 3 * allowed[0, 1, 4]
    verdict = eb.check_forward(out, q, k, v, dtype="float32")
    assert not verdict and verdict.where == (0, 1, 4, 2)
    assert verdict.used == pytest.approx(3.0) and verdict.amount == pytest.approx(3 * allowed[0, 1, 4])
    assert "row (0, 1, 4)" in verdict.message and "by" in verdict.message
    ok = eb.check_forward(r, q, k, v, dtype="float32")
    assert ok and ok.used == 0.0  # the reference itself uses nothing


def test_rows_restrict_but_where_stays_a_full_index():
    q, k, v = _problem(13, Lq=6, Lk=6)
    mask = np.ones((6, 6), dtype=bool)
    mask[3] = False  # row 3 sees nothing: not judged
    rows = np.broadcast_to(mask.any(axis=-1), (2, 3, 6))  # (B, H, Lq)
    out = eb.plain_forward(q, k, v, mask, dtype="float16").astype(np.float64)
    out[1, 0, 4, 1] += 0.5  # a judged row, wrong
    verdict = eb.check_forward(out, q, k, v, mask, dtype="float16", rows=rows)
    assert not verdict and verdict.where == (1, 0, 4, 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradient_and_lse_budgets_are_per_row(dtype):
    q, k, v = _problem(14, Lq=5, Lk=7)
    g = np.random.default_rng(14).normal(size=(2, 3, 5, 8))  # (B, H, Lq, Ev)
    bias = np.random.default_rng(15).normal(size=(1, 3, 5, 7))  # (1, H, Lq, Lk)
    budgets = eb.backward_allowed_rows(q, k, v, g, dtype=dtype, bias=bias)
    shapes = [a.shape for a, _, _ in budgets]
    assert shapes == [(2, 3, 5), (2, 3, 7), (2, 3, 7), (1, 3, 5)]  # dq, dk, dv per row; dbias per bias row
    assert all((a > 0).all() for a, _, _ in budgets)
    grads = eb.plain_backward(q, k, v, g, dtype=dtype, bias=bias)
    assert all(eb.check_backward(grads, q, k, v, g, dtype=dtype, bias=bias))
    allowed, lse, _ = eb.lse_allowed_rows(q, k, v, dtype=dtype, is_causal=True)
    assert allowed.shape == lse.shape == (2, 3, 5) and (allowed > 0).all()
    assert eb.check_lse(eb.plain_lse(q, k, v, dtype=dtype, is_causal=True), q, k, v, dtype=dtype, is_causal=True)
    sums_allowed, sums = eb.row_sum_allowed_rows(q, k, v, dtype=dtype)
    assert sums_allowed.shape == sums.shape == (2, 3, 5) and (np.abs(sums - 1) <= sums_allowed).all()


def test_flash_rule_is_a_parameter_and_allows_nothing_in_float64():
    q, k, v = _problem(16, Lq=4, Lk=5)
    r = ref.attention(q, k, v)
    allowed, _, plain = eb.forward_allowed_rows(q, k, v, dtype="float64", rule="flash")
    assert (allowed == 0).all()  # float64's plain computation is the reference: 2 x 0
    assert not eb.check_forward(r + 1e-15, q, k, v, dtype="float64", rule="flash")
    allowed16, r16, plain16 = eb.forward_allowed_rows(q, k, v, dtype="float16", rule="flash")
    assert (allowed16 == 2 * np.abs(plain16 - r16).max()).all()  # one number for the tensor
    with pytest.raises(ValueError, match="rule must be one of attnspec, flash"):
        eb.forward_allowed_rows(q, k, v, dtype="float16", rule="strict")
    assert eb.check_forward(r + 1e-15, q, k, v, dtype="float64")  # ours (the default): rounding dust is fine


def test_flushing_subnormal_terms_is_allowed_where_cpu_kernels_do_it():
    """XLA returned 0 for a float32 dK of -3.0e-38: a sum of subnormal products, each flushed.
    Each of a row's n terms may be flushed (n tau) in float32/bfloat16/float64; float16 keeps
    its subnormals (its kernels compute in float32 and round), so there only u tau."""
    from attnspec.specs.error_budget import BUDGETS

    tau32 = float(np.finfo(np.float32).tiny)
    assert BUDGETS["float32"].tiny(6) == 6 * tau32
    assert BUDGETS["bfloat16"].tiny(1) == tau32 + 2.0**-25  # and a result stored in float16 (below)
    assert BUDGETS["float64"].tiny(3) == 3 * float(np.finfo(np.float64).tiny)
    assert BUDGETS["float16"].tiny(6) == 2.0**-11 * 2.0**-14
    assert BUDGETS["float32"].floor(0.0, 6) >= 2 * 3.04006e-38  # the flushed dK above fits


def test_a_bfloat16_result_stored_in_float16_may_round_to_its_subnormal_grid():
    """A kernel computing float16 inputs in bfloat16 returns float16 (OpenVINO's CPU plugin at its default
    precision): an output of -4.4e-8 (a sink of 13.25 outweighs every key) is stored as -2^-24 = -6.0e-8,
    float16's nearest subnormal.  The bfloat16 budget allows what that storing costs, and nothing like it
    without the term; a result off by a float16 subnormal step more is still rejected."""
    import dataclasses

    from attnspec.specs.error_budget import BUDGETS
    q, k, v = np.zeros((1, 1, 1, 1)), np.zeros((1, 1, 3, 1)), np.full((1, 1, 3, 1), -0.0083)  # (B, H, L, E)
    sinks = np.array([13.25])
    want = ref.forward(q, k, v, None, False, None, sinks=sinks).output  # (1, 1, 1, 1): -4.4e-8
    stored = eb.round_to(want, "float16")
    assert stored[0, 0, 0, 0] == -(2.0**-24) and abs(want[0, 0, 0, 0]) < 2.0**-24  # a subnormal step off
    assert eb.check_forward(stored, q, k, v, None, False, None, "bfloat16", sinks=sinks)
    bare = dataclasses.replace(BUDGETS["bfloat16"], stored_floor=0.0)
    assert bare.tiny(1) < 1e-37  # bfloat16's own range: no floor near float16's subnormals
    off = stored - 2.0**-24  # one more float16 subnormal step
    assert not eb.check_forward(off, q, k, v, None, False, None, "bfloat16", sinks=sinks)


def test_a_float16_row_sum_with_the_sink_folded_after_it_is_allowed():
    """A float16 kernel that holds its row sum in the format and folds the sink after the keys' sum
    rounds the sum twice: eager code writes it so (``e.sum(-1) + exp(sink - max)``: torch-math, jax-naive,
    numpy-naive; FlashInfer folds the sink after its loop).  The plain computation does the same, so the
    row's allowance follows it (found: all three at 1.08 x the allowance on this row when the plain
    computation summed keys and sink at once - two keys, w = 0.0025 and 0.997, a sink of weight 0.00055:
    1.00246 rounds up to 1.00293, then 1.00348 up to 1.00391, 1.8 u off)."""
    q, k = np.ones((1, 1, 1, 1)), np.array([-2.00390625, 4.0]).reshape(1, 1, 2, 1)  # (B, H, L, E): scores -2.004, 4
    v = np.array([[3.75, 0, 0.625, 0.375, -1.875, 0.75, 0],
                  [3.125, 1.25, -0.75, -0.625, -0.5, -0.375, 0]]).reshape(1, 1, 2, 7)  # (B, H, Lk, Ev)
    sinks = np.array([-3.5])
    h = np.float16
    e = np.exp(np.array([-6.00390625, 0.0], dtype=h))  # (Lk,) exp(s - max) in float16
    total = h(e.sum(dtype=h)) + np.exp(h(-7.5))  # the keys' sum rounded, then the sink's term added and rounded
    assert total == h(1.00390625)  # two roundings up: the case this test is about
    w = (e / total).astype(h)  # (Lk,)
    out = (w.astype(np.float32) @ v[0, 0].astype(np.float32)).astype(h).reshape(1, 1, 1, 7)  # (B, H, Lq, Ev)
    assert eb.check_forward(out, q, k, v, None, False, 1.0, "float16", sinks=sinks)
    off = out.astype(np.float64)
    off[..., 0] -= 5 * 2.0**-9  # five float16 steps more at 3.1 (its spacing there: 2^-9)
    assert not eb.check_forward(off, q, k, v, None, False, 1.0, "float16", sinks=sinks)


class _Flushing(eb._Plain):
    """The plain pipeline as an FTZ kernel runs it: every intermediate rounded, then flushed to 0
    below the format's smallest normal (XLA and OpenVINO on CPU)."""

    def r(self, x):
        y = super().r(x)
        return np.where(np.abs(y) < np.finfo(y.dtype).tiny, 0, y).astype(y.dtype)


def test_a_flushed_weight_is_allowed_what_it_multiplies():
    """A weight exp(-90) = 8.2e-40 (subnormal in float32) flushed to 0 takes its whole product out
    of dK = scale dS^T Q: 8.2e-40 |dA - r| |q| = 2.1e-37, a normal number and ~9 n tau (jax-dpa
    gave 0 for a dK of -7.0e-37 this way).  The terms carry tau / sigma where kernels flush; a
    gain of 1e-6 on the same gradients is still rejected."""
    from attnspec.specs.reference import run_backward

    q, k = np.array([[[[32.0]]]]), np.array([[[[0.0], [-2.8125]]]])  # scores 0 and -90: w_1 = exp(-90)
    v, g = np.array([[[[0.0], [4.0]]]]), np.array([[[[2.0]]]])
    p = validate(q, k, v)
    flushed = [np.asarray(x, np.float64) for x in run_backward(p, g, _Flushing("float32"))]
    exact = ref.backward(q, k, v, g)
    assert flushed[1][0, 0, 1, 0] == 0 and abs(exact[1][0, 0, 1, 0]) > 8 * 2 * np.finfo(np.float32).tiny  # n = 2
    assert all(eb.check_backward(tuple(flushed), q, k, v, g, dtype="float32"))
    q2, k2 = np.array([[[[1.0], [0.5]]]]), np.array([[[[0.25], [-1.0]]]])  # a problem of normal size
    v2, g2 = np.array([[[[1.0], [-2.0]]]]), np.array([[[[1.0], [0.5]]]])
    gained = tuple(x * (1 + 1e-6) for x in ref.backward(q2, k2, v2, g2))
    assert not all(eb.check_backward(gained, q2, k2, v2, g2, dtype="float32"))


class _TanhOffBy:
    """NumPy seen through specs.reference, with a tanh `ulps` ulps toward zero (XLA's CPU tanh
    is 6 ulps from tanh in float64; NumPy's and PyTorch's 1)."""

    def __init__(self, ulps):
        self.ulps = ulps

    def __getattr__(self, name):
        return getattr(np, name)

    def tanh(self, x):
        t = np.tanh(x)
        for _ in range(self.ulps):
            t = np.nextafter(t, 0.0)
        return t


@pytest.mark.parametrize("ulps,within", [(6, True), (200, False)])
def test_a_softcap_gradient_from_a_tanh_a_few_ulps_off_is_within_budget(monkeypatch, ulps, within):
    """The softcap's derivative 1 - t^2 cancels where the cap saturates: a tanh a few ulps off
    (a real library's) moves it by ~2 t ulps absolute, which the budget allows (specs.budget_terms.
    TANH_ULPS); a tanh far off does not pass.  Found by CI: jax-naive's float64 dQ 1.01 x over."""
    rng = np.random.default_rng(3)
    # every score 32-37: t = tanh(s / 2) within 2e-14 of 1; n = 2 keeps sigma (the reductions' share) small
    q, k = (5.0 + 0.25 * rng.standard_normal((1, 2, 2, 2)) for _ in range(2))  # (B, H, L, E)
    v, grad_out = rng.standard_normal((1, 2, 2, 2)), rng.standard_normal((1, 2, 2, 2))
    fields = dict(softcap=2.0)
    monkeypatch.setattr(ref, "np", _TanhOffBy(ulps))
    actual = ref.backward(q, k, v, grad_out, **fields)
    monkeypatch.undo()
    verdicts = eb.check_backward(actual, q, k, v, grad_out, dtype="float64", **fields)
    assert all(bool(v) for v in verdicts) == within, [str(v) for v in verdicts]


def _softcapped_forward(q, k, v, cap, offset):
    """A correct float64 kernel: q.k summed one term after another, last term first (BLAS sums in
    another order), then the softcap, a causal mask on diagonal i + offset, the softmax."""
    products = q[..., :, None, :] * k[..., None, :, :]  # (B, H, Lq, Lk, E)
    raw = np.cumsum(products[..., ::-1], axis=-1)[..., -1] / np.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
    s = cap * np.tanh(raw / cap)
    rows, cols = np.arange(q.shape[-2])[:, None], np.arange(k.shape[-2])
    s = np.where(cols <= rows + offset, s, -np.inf)  # (B, H, Lq, Lk)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ v  # (B, H, Lq, Ev)


@pytest.mark.parametrize("gain,within", [(0.0, True), (1e-12, False)])
def test_a_softcap_keeps_the_error_of_a_raw_score_near_zero(gain, within):
    """Under a softcap of 4 with |q|.|k| / 8 ~ 2000, a raw score that cancels to near 0 keeps its
    rounding error (~1e-13) through tanh, whose slope is 1 there: a weight moves by that relative
    error.  The budget once took min(R, cap) as the capped score's size and failed jax-naive's
    float64 output 1.48 x over; it now takes R (1 - t^2) + |c|.  A gain of 1e-12 is still rejected."""
    rng = np.random.default_rng(1681)  # the draw CI failed
    q, k = rng.standard_normal((1, 1, 17, 64)) * 16, rng.standard_normal((1, 1, 64, 64)) * 16
    v = np.eye(64)[None, None]  # (1, 1, Lk, Ev): the output is the weights
    fields = dict(is_causal=True, causal_alignment="bottom_right", softcap=4.0)
    out = _softcapped_forward(q, k, v, 4.0, 64 - 17) * (1 + gain)
    # the raw score's rounding reaches the weights (the amount depends on the BLAS kernel's summation
    # order: 3.6e-16 with OpenBLAS's Haswell kernels, past the old allowance's 4e-16 with others)
    assert np.abs(out - ref.forward(q, k, v, **fields).output).max() > 1e-16
    assert bool(eb.check_forward(out, q, k, v, dtype="float64", **fields)) == within


def test_a_small_softcaps_float16_backward_through_autograd_stays_within_budget():
    """Autograd of cap * tanh(s / cap) in float16 holds dS * cap, subnormal at cap 1/64 (~5e-6), before
    dividing by cap: the budget carries that rounding's tau / cap.  The problem a ci seed drew for
    torch-math (sinks, dsink_matches_reference): dQ off by 8 subnormal ulps, 1.9 x over without it."""
    from attnspec.backends.registry import resolve
    from attnspec.properties.case import Case
    from attnspec.properties.judge import grad_out
    from tests._helpers import target_of

    pytest.importorskip("torch")
    q = np.array([[[[0.0], [0.03125], [-0.03125]]], [[[0.0625], [-0.0625], [0.09375]]]])  # (B, H, Lq, E)
    k = np.array([[[[0.0625], [-0.0625], [0.09375]]], [[[-0.09375], [0.125], [-0.125]]]])  # (B, H, Lk, E)
    v = np.array([[[[0.375], [-0.375], [0.5]]], [[[-0.5], [0.625], [-0.625]]]])  # (B, H, Lk, Ev)
    fields = dict(softcap=0.015625, q_lengths=np.array([3, 3]), kv_lengths=np.array([3, 2]), sinks=np.array([7.25]))
    case = Case(q, k, v, None, False, None, fields)
    target = target_of(resolve("torch-math"), "float16")
    g = grad_out(case, "float16", 0)
    got = target.backward(case, g)
    verdicts = eb.check_backward(got, case.problem, None, None, g, dtype="float16")
    assert all(verdicts), [v.message for v in verdicts if not v]
