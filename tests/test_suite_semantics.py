"""The semantics profile judges what a backend declares and records the rest, in every dtype.

Each question of properties/test_semantics.py is asked of small plain functions (the way a
user plugs a library in, with `backends.declare`): a declared answer that holds passes, one
that does not fails, an undeclared one is recorded (never failed), per dtype.
"""
from __future__ import annotations

import numpy as np
import pytest

from attnspec.backends import declare
from attnspec.backends.plain import FunctionBackend
from attnspec.properties import test_semantics as S
from attnspec.properties.targets import Target

DTYPES = ("float64", "float32", "float16")


def _attention(q, k, v, attn_mask=None, is_causal=False, scale=None, empty="zeros", align="top_left",
               inside=None, out_dtype=None, q_lengths=None, padded="zeros", fill=-np.inf):
    """Attention over NumPy arrays; what a row that sees nothing gets (`empty`), the causal
    alignment, the dtype computed in (`inside`) and returned (`out_dtype`), padded query rows."""
    dtype = q.dtype
    if inside is not None:
        q, k, v = (x.astype(inside) for x in (q, k, v))
    Lq, Lk = q.shape[-2], k.shape[-2]
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    vis = np.ones((Lq, Lk), dtype=bool) if attn_mask is None else np.asarray(attn_mask, dtype=bool)  # (.., Lq, Lk)
    if is_causal:
        vis = vis & np.tri(Lq, Lk, Lk - Lq if align == "bottom_right" else 0, dtype=bool)  # (..., Lq, Lk)
    s = np.where(vis, (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(scale), q.dtype.type(fill))  # (..., Lq, Lk)
    m = s.max(axis=-1, keepdims=True)  # (..., Lq, 1)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))  # (..., Lq, Lk)
    total = e.sum(axis=-1, keepdims=True)  # (..., Lq, 1)
    out = (e / np.where(total == 0, 1, total)) @ v  # (..., Lq, Ev)
    seen = np.broadcast_to(vis.any(axis=-1), out.shape[:-1])  # (..., Lq)
    rows = {"zeros": 0.0, "nan": np.nan}
    if fill == -np.inf and empty in rows:
        out = np.where(seen[..., None], out, out.dtype.type(rows[empty]))
    if q_lengths is not None and padded in rows:
        pad = np.arange(Lq) >= np.asarray(q_lengths)[:, None, None]  # (B, 1, Lq)
        out = np.where(pad[..., None], out.dtype.type(rows[padded]), out)
    return out.astype(out_dtype or dtype)


def plain(query, key, value, attn_mask=None, is_causal=False, scale=None):
    return _attention(query, key, value, attn_mask, is_causal, scale)


def bottom_right(query, key, value, attn_mask=None, is_causal=False, scale=None):
    return _attention(query, key, value, attn_mask, is_causal, scale, align="bottom_right")


def nan_or_mean(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """A fully masked row is NaN in float32 and float16, the mean of the values in float64 (a
    finite fill makes the weights uniform): an answer that changes with the dtype."""
    if query.dtype == np.float64:
        return _attention(query, key, value, attn_mask, is_causal, scale, fill=-1e30)
    return _attention(query, key, value, attn_mask, is_causal, scale, empty="nan")


def finite_fill(query, key, value, attn_mask=None, is_causal=False, scale=None):
    return _attention(query, key, value, attn_mask, is_causal, scale, fill=-1e4)  # float16's range: uniform rows


def float32_out(query, key, value, attn_mask=None, is_causal=False, scale=None):
    return _attention(query, key, value, attn_mask, is_causal, scale, inside=np.float32, out_dtype=np.float32)


def float32_inside(query, key, value, attn_mask=None, is_causal=False, scale=None):
    return _attention(query, key, value, attn_mask, is_causal, scale, inside=np.float32)


def float16_inside(query, key, value, attn_mask=None, is_causal=False, scale=None):
    return plain(*(x.astype(np.float16) for x in (query, key, value)), attn_mask, is_causal, scale).astype(query.dtype)


def padded_zeros(query, key, value, attn_mask=None, is_causal=False, scale=None, q_lengths=None):
    return _attention(query, key, value, attn_mask, is_causal, scale, q_lengths=q_lengths)


def padded_computed(query, key, value, attn_mask=None, is_causal=False, scale=None, q_lengths=None):
    return _attention(query, key, value, attn_mask, is_causal, scale)  # padded rows computed like any other


def aligned_by_parameter(query, key, value, attn_mask=None, is_causal=False, scale=None, causal_alignment="top_left"):
    return _attention(query, key, value, attn_mask, is_causal, scale, align=causal_alignment)


def _declared(fn, **declarations):
    """A copy of fn with declarations (declare attaches them to the function object)."""
    def copy(query, key, value, attn_mask=None, is_causal=False, scale=None, **kw):
        return fn(query, key, value, attn_mask, is_causal, scale, **kw)
    copy.__signature__ = __import__("inspect").signature(fn)
    copy.__name__ = fn.__name__
    return declare(copy, dtypes=DTYPES, **declarations)


def ask(question, fn, dtype: str, **params):
    """(verdict, row): passed | failed | recorded | skipped, and the row the question recorded."""
    target = Target(FunctionBackend(fn if hasattr(fn, "__attnspec__") else declare(fn, dtypes=DTYPES),
                                    fn.__name__), dtype)
    target.in_hypothesis, target.current_property = False, question.__name__
    rows = []

    def record(q, observed, declared, agrees):
        rows.append(dict(question=q, observed=observed, declared=declared, agrees=agrees))
    try:
        question(target=target, record_semantics=record, **params)
    except AssertionError:
        return "failed", rows[0]
    except pytest.skip.Exception as e:
        return "skipped", str(e)
    return ("recorded" if rows[0]["agrees"] is None else "passed"), rows[0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_undeclared_fully_masked_rows_are_recorded_never_failed(dtype):
    assert ask(S.test_fully_masked_rows, plain, dtype) == ("recorded", dict(
        question="fully_masked", observed="zeros", declared=None, agrees=None))


@pytest.mark.parametrize("dtype", DTYPES)
def test_declared_fully_masked_rows_are_judged(dtype):
    assert ask(S.test_fully_masked_rows, _declared(plain, fully_masked="zeros"), dtype)[0] == "passed"
    verdict, row = ask(S.test_fully_masked_rows, _declared(plain, fully_masked="nan"), dtype)
    assert (verdict, row["observed"], row["declared"]) == ("failed", "zeros", "nan")


def test_an_answer_that_changes_with_the_dtype_is_seen_in_each():
    answers = {d: ask(S.test_fully_masked_rows, nan_or_mean, d) for d in DTYPES}
    assert {d: a[1]["observed"] for d, a in answers.items()} == {
        "float64": "mean_of_values", "float32": "nan", "float16": "nan"}
    assert {a[0] for a in answers.values()} == {"recorded"}  # undeclared: never failed
    verdicts = {d: ask(S.test_fully_masked_rows, _declared(nan_or_mean, fully_masked="nan"), d)[0] for d in DTYPES}
    assert verdicts == {"float64": "failed", "float32": "passed", "float16": "passed"}


@pytest.mark.parametrize("dtype", DTYPES)
def test_mean_of_values_is_decided_with_the_dtypes_budget(dtype):
    """A finite mask fill gives uniform weights: float16's rounding of the mean is within its budget."""
    assert ask(S.test_fully_masked_rows, finite_fill, dtype)[1]["observed"] == "mean_of_values"


def test_a_dtype_mismatch_is_its_own_finding_and_the_other_questions_still_answer():
    verdict, row = ask(S.test_output_dtype, float32_out, "float64")
    assert (verdict, row["observed"], row["declared"]) == ("failed", "float32", "float64")
    assert ask(S.test_fully_masked_rows, float32_out, "float64")[1]["observed"] == "zeros"  # not "error"
    assert ask(S.test_output_dtype, float32_out, "float32")[0] == "passed"
    declared = _declared(float32_out, output_dtypes={"float64": "float32"})
    assert ask(S.test_output_dtype, declared, "float64")[0] == "passed"
    assert ask(S.test_effective_precision, declared, "float64") == ("passed", dict(
        question="effective_precision", observed="float32", declared="float32", agrees=True))


def test_effective_precision_is_recorded_and_judged_when_declared():
    assert ask(S.test_effective_precision, plain, "float64")[1]["observed"] == "float64"
    assert ask(S.test_effective_precision, float32_inside, "float64") == ("recorded", dict(
        question="effective_precision", observed="float32", declared=None, agrees=None))
    assert ask(S.test_effective_precision, _declared(float32_inside, effective_precision="float32"), "float64")[0] == "passed"
    # a declared precision bounds the error from above: more accurate results agree, worse ones contradict
    assert ask(S.test_effective_precision, _declared(plain, effective_precision="float32"), "float64") == (
        "passed", dict(question="effective_precision", observed="float64", declared="float32", agrees=True))
    assert ask(S.test_effective_precision, _declared(float16_inside, effective_precision="float32"), "float64") == (
        "failed", dict(question="effective_precision", observed="float16", declared="float32", agrees=False))
    # narrower than the input only: float16 input is judged as float16
    assert ask(S.test_effective_precision, _declared(float32_inside, effective_precision="float32"), "float16") == (
        "passed", dict(question="effective_precision", observed="float16", declared="float16", agrees=True))


def test_causal_alignment_asked_only_where_it_is_not_a_parameter():
    assert ask(S.test_causal_alignment, bottom_right, "float32") == ("recorded", dict(
        question="causal_alignment", observed="bottom_right", declared=None, agrees=None))
    assert ask(S.test_causal_alignment, _declared(bottom_right, causal_alignment="bottom_right"), "float32")[0] == "passed"
    assert ask(S.test_causal_alignment, _declared(plain, causal_alignment="bottom_right"), "float32")[0] == "failed"
    verdict, why = ask(S.test_causal_alignment, aligned_by_parameter, "float32")
    assert verdict == "skipped" and "takes the causal alignment as a parameter" in why


@pytest.mark.parametrize("dtype", DTYPES)
def test_padded_rows(dtype):
    assert ask(S.test_padded_rows, padded_zeros, dtype)[:2] == ("recorded", dict(
        question="padded_rows", observed="zeros", declared=None, agrees=None))
    assert ask(S.test_padded_rows, _declared(padded_zeros, padded_rows="zeros"), dtype)[0] == "passed"
    verdict, row = ask(S.test_padded_rows, _declared(padded_computed, padded_rows="zeros"), dtype)
    assert (verdict, row["observed"]) == ("failed", "computed")
    verdict, why = ask(S.test_padded_rows, plain, dtype)
    assert verdict == "skipped" and "seq_lengths" in why


def test_recorded_only_questions_never_fail():
    for question, params in ((S.test_nan_in_unmasked_query, {}),
                             (S.test_non_finite_in_masked_pair, dict(bad=np.nan, where="value"))):
        for fn in (plain, _declared(plain, fully_masked="zeros")):
            assert ask(question, fn, "float32", **params)[0] == "recorded"
