"""The semantics profile judges what a backend declares and records the rest, in every dtype.

Each question of properties/test_semantics.py is asked of small plain functions (the way a
user plugs a library in, with `backends.declare`): a declared answer that holds passes, one
that does not fails with the suite's own message, an undeclared one is recorded (never failed),
per dtype.  Questions are grid properties: `explore` runs the property's own check on its probe.
"""
from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

from attnspec.backends import declare
from attnspec.backends.plain import FunctionBackend
from attnspec.backends.registry import resolve
from attnspec.properties import test_semantics as S
from attnspec.properties.explore import Exploration, explore
from attnspec.properties.plugin import skip_reason
from attnspec.properties.runner import run_suite
from attnspec.properties.target import Session, Target
from tests._helpers import target_of as shared_target_of
from tests.plugins import planted

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Lq, 1)
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


def padded_zeros(query, key, value, attn_mask=None, is_causal=False, scale=None, q_lengths=None, kv_lengths=None):
    return _attention(query, key, value, attn_mask, is_causal, scale, q_lengths=q_lengths)


def padded_computed(query, key, value, attn_mask=None, is_causal=False, scale=None, q_lengths=None, kv_lengths=None):
    return _attention(query, key, value, attn_mask, is_causal, scale)  # padded rows computed like any other


def aligned_by_parameter(query, key, value, attn_mask=None, is_causal=False, scale=None, causal_alignment="top_left"):
    return _attention(query, key, value, attn_mask, is_causal, scale, align=causal_alignment)


def raises_everywhere_empty(query, key, value, attn_mask=None, is_causal=False, scale=None):
    if 0 in query.shape or 0 in key.shape:
        raise ValueError("empty input")
    return plain(query, key, value, attn_mask, is_causal, scale)


def drops_causal_undeclared(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """planted.drops_causal_for_one_row without its declarations."""
    return planted.drops_causal_for_one_row(query, key, value, attn_mask, is_causal, scale)


def _declared(fn, **declarations):
    """A copy of fn with declarations (declare attaches them to the function object)."""
    def copy(query, key, value, attn_mask=None, is_causal=False, scale=None, **kw):
        return fn(query, key, value, attn_mask, is_causal, scale, **kw)
    copy.__signature__ = inspect.signature(fn)
    copy.__name__ = fn.__name__
    return declare(copy, dtypes=DTYPES, **declarations)


def target_of(fn, dtype: str) -> Target:
    backend = FunctionBackend(fn if hasattr(fn, "__attnspec__") else declare(fn, dtypes=DTYPES), fn.__name__)
    return shared_target_of(backend, dtype, spec=fn.__name__)


def ask(question, fn, dtype: str, full=False):
    """(verdict, row): passed | failed | recorded | skipped, and the answer the question recorded
    (question, observed, declared, agrees) - or the skip's reason.  full: (verdict, row, failure)."""
    target = target_of(fn, dtype)
    prop = question.property
    reason = skip_reason(prop, target)  # what the plugin skips before the check runs
    if reason:
        return "skipped", reason
    try:
        failure = explore(prop, target, Exploration())
    except pytest.skip.Exception as e:
        return "skipped", str(e)
    (answer,) = target.answers
    row = {k: answer[k] for k in ("question", "observed", "declared", "agrees")}
    assert answer["backend"] == fn.__name__ and answer["dtype"] == dtype
    verdict = "failed" if failure is not None else "recorded" if row["agrees"] is None else "passed"
    if failure is not None:  # the suite's own verdict, naming the declaration and what was seen
        assert failure.verdict.message.startswith(f"{fn.__name__} declares "), failure.verdict.message
        assert repr(row["observed"]) in failure.verdict.message
    return (verdict, row, failure) if full else (verdict, row)


@pytest.mark.parametrize("dtype", DTYPES)
def test_undeclared_fully_masked_rows_are_recorded_never_failed(dtype):
    assert ask(S.test_fully_masked_rows, plain, dtype) == ("recorded", dict(
        question="fully_masked", observed="zeros", declared=None, agrees=None))


@pytest.mark.parametrize("dtype", DTYPES)
def test_declared_fully_masked_rows_are_judged(dtype):
    assert ask(S.test_fully_masked_rows, _declared(plain, fully_masked="zeros"), dtype)[0] == "passed"
    verdict, row, failure = ask(S.test_fully_masked_rows, _declared(plain, fully_masked="nan"), dtype, full=True)
    assert (verdict, row["observed"], row["declared"], row["agrees"]) == ("failed", "zeros", "nan", False)
    assert failure.verdict.message == f"plain declares fully_masked = 'nan' but at {dtype} does 'zeros'"


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


# ---- causal alignment --------------------------------------------------------------------------------

def test_causal_alignment_asked_only_where_it_is_not_a_parameter():
    assert ask(S.test_causal_alignment, bottom_right, "float32") == ("recorded", dict(
        question="causal_alignment", observed="bottom_right", declared=None, agrees=None))
    assert ask(S.test_causal_alignment, plain, "float32")[1]["observed"] == "top_left"
    assert ask(S.test_causal_alignment, _declared(bottom_right, causal_alignment="bottom_right"), "float32")[0] == "passed"
    verdict, row = ask(S.test_causal_alignment, _declared(plain, causal_alignment="bottom_right"), "float32")
    assert (verdict, row["observed"]) == ("failed", "top_left")
    verdict, why = ask(S.test_causal_alignment, aligned_by_parameter, "float32")
    assert verdict == "skipped" and "takes the causal alignment as a parameter" in why


def test_causal_alignment_is_judged_within_the_backends_precision():
    """float64 input computed in float32 meets neither alignment within float64's budget; within
    float32's it is top-left - the answer, not "other"."""
    assert ask(S.test_causal_alignment, planted.float32_inside_top_left, "float64") == ("passed", dict(
        question="causal_alignment", observed="top_left", declared="top_left", agrees=True))
    assert ask(S.test_causal_alignment, float32_inside, "float64")[1]["observed"] == "top_left"  # undeclared too
    assert ask(S.test_causal_alignment, planted.float32_inside_top_left, "float32")[0] == "passed"


@pytest.mark.parametrize("dtype", ("float64", "float32"))
def test_a_causal_mask_dropped_for_a_one_row_query_is_an_answer_that_changes_with_the_shape(dtype):
    """transformers' SDPA path drops is_causal for a one-row query: bottom-right at a decode step
    (Lq = 1 < Lk = 4), top-left at Lq = 3 < Lk = 4 and Lq = 5 > Lk = 3."""
    changes = ("changes with the shape: Lq=1 Lk=4: bottom_right; Lq=3 Lk=4: top_left; Lq=5 Lk=3: top_left")
    verdict, row, failure = ask(S.test_causal_alignment, planted.drops_causal_for_one_row, dtype, full=True)
    assert (verdict, row) == ("failed", dict(question="causal_alignment", observed=changes, declared="top_left",
                                             agrees=False))
    assert failure.verdict.message == (f"drops_causal_for_one_row declares causal_alignment = 'top_left' but at "
                                       f"{dtype} does {changes!r}")
    assert ask(S.test_causal_alignment, drops_causal_undeclared, dtype) == ("recorded", dict(
        question="causal_alignment", observed=changes, declared=None, agrees=None))


@pytest.mark.slow
def test_a_contradicted_declaration_fails_with_the_suites_message_and_shows_in_the_semantics_profile(tmp_path):
    result = run_suite(["tests.plugins.planted:drops_causal_for_one_row"], json_path=str(tmp_path / "out.json"),
                       extra_args=["-k", "test_semantics.py and (causal_alignment or empty_sizes)"], profile="dev",
                       cwd=str(tmp_path), pythonpath=[ROOT], timeout=600)
    status = {(r["property"], r["dtype"]): r["status"] for r in result.conformance}
    assert status == {("causal_alignment", "float64"): "failed", ("causal_alignment", "float32"): "failed",
                      ("empty_sizes", "float64"): "passed", ("empty_sizes", "float32"): "passed"}, result.output[-3000:]
    failures = result.output.split("= FAILURES =")[1].split("= attnspec: per backend")[0]
    assert "declares causal_alignment = 'top_left' but at float64 does 'changes with the shape: Lq=1 Lk=4: " \
           "bottom_right; Lq=3 Lk=4: top_left; Lq=5 Lk=3: top_left'" in failures
    assert "assert " not in failures and "Traceback" not in failures and "\nE " not in failures
    assert failures.count("reproducer: python ") == 2
    # the contradicted answer is in the profile too, as every answer is
    answers = {(r["question"], r["dtype"]): r for r in result.semantics}
    assert answers[("causal_alignment", "float64")]["agrees"] is False, result.semantics
    assert answers[("causal_alignment", "float64")]["observed"].startswith("changes with the shape: ")
    assert "CONTRADICTS" in result.output.split("semantics profile")[1]


# ---- padded rows, recorded-only questions -------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_padded_rows(dtype):
    assert ask(S.test_padded_rows, padded_zeros, dtype) == ("recorded", dict(
        question="padded_rows", observed="zeros", declared=None, agrees=None))
    assert ask(S.test_padded_rows, _declared(padded_zeros, padded_rows="zeros"), dtype)[0] == "passed"
    verdict, row = ask(S.test_padded_rows, _declared(padded_computed, padded_rows="zeros"), dtype)
    assert (verdict, row["observed"]) == ("failed", "computed")
    verdict, why = ask(S.test_padded_rows, plain, dtype)
    assert verdict == "skipped" and "per-sequence lengths" in why


@pytest.mark.parametrize("question", [S.test_masked_nan_key, S.test_masked_nan_value, S.test_masked_inf_key,
                                      S.test_masked_inf_value, S.test_nan_in_unmasked_query])
def test_recorded_only_questions_never_fail(question):
    for fn in (plain, _declared(plain, fully_masked="zeros"), _declared(plain, fully_masked="nan")):
        verdict, row = ask(question, fn, "float32")
        assert verdict == "recorded" and row["declared"] is None, (fn, row)
    assert ask(S.test_masked_nan_value, plain, "float32")[1]["observed"] == "leaks"  # 0 * NaN = NaN
    assert ask(S.test_masked_nan_key, plain, "float32")[1]["observed"] == "no_leak"  # its score is replaced
    assert ask(S.test_nan_in_unmasked_query, plain, "float32")[1]["observed"] == "row_only"


# ---- empty sizes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ("float64", "float32"))
def test_empty_sizes_an_output_of_zeros_for_no_keys_is_zeros(dtype):
    assert ask(S.test_empty_sizes, plain, dtype) == ("recorded", dict(
        question="empty_sizes", observed="zeros", declared=None, agrees=None))
    assert ask(S.test_empty_sizes, _declared(plain, fully_masked="zeros"), dtype)[0] == "passed"
    verdict, row = ask(S.test_empty_sizes, _declared(plain, fully_masked="mean_of_values"), dtype)
    assert (verdict, row["observed"], row["agrees"]) == ("passed", "zeros", True)  # anything but an error


def textbook(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """softmax(s) @ v as written in a course (or flash-attention's attention_ref): a row the mask hides
    is 0/0 = NaN; with no keys at all there are no weights and P V sums nothing: zeros."""
    scale = 1 / np.sqrt(query.shape[-1]) if scale is None else scale
    s = query @ np.swapaxes(key, -1, -2) * scale  # (..., Lq, Lk)
    if attn_mask is not None:
        s = np.where(attn_mask, s, -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True, initial=-np.inf))  # (..., Lq, Lk)
        return (e / e.sum(axis=-1, keepdims=True)) @ value  # (..., Lq, Ev)


@pytest.mark.parametrize("dtype", ("float64", "float32"))
def test_empty_sizes_zeros_for_no_keys_agree_with_nan_for_a_hidden_row(dtype):
    """Declared "nan" (a masked row's 0/0), Lk = 0 may give zeros (an empty sum): the textbook softmax
    declares what it does and passes both questions; zeros for hidden rows still contradict "nan"."""
    nan_rows = _declared(textbook, fully_masked="nan")
    assert ask(S.test_fully_masked_rows, nan_rows, dtype)[0] == "passed"
    verdict, row = ask(S.test_empty_sizes, nan_rows, dtype)
    assert (verdict, row["observed"], row["agrees"]) == ("passed", "zeros", True)
    assert ask(S.test_fully_masked_rows, _declared(plain, fully_masked="nan"), dtype)[0] == "failed"


def causal_only(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """A causal-only oracle (vLLM's ref_paged_attn): a non-causal call is a problem it declines."""
    from attnspec.backends.base import Unsupported

    if not is_causal:
        raise Unsupported("causal calls only")
    return plain(query, key, value, attn_mask, is_causal, scale)


@pytest.mark.parametrize("question", [S.test_output_dtype, S.test_effective_precision, S.test_fully_masked_rows],
                         ids=["output_dtype", "effective_precision", "fully_masked"])
def test_a_probe_the_backend_declines_is_recorded_not_a_contradiction(question):
    verdict, row = ask(question, _declared(causal_only, fully_masked="zeros", effective_precision="float64"), "float64")
    assert (verdict, row["observed"], row["agrees"]) == ("recorded", "declined", None), row


@pytest.mark.parametrize("fn", [planted.raises_at_no_keys, raises_everywhere_empty], ids=["Lk=0", "every empty size"])
def test_empty_sizes_a_raise_is_the_answer_error(fn):
    """A backend that raises where a row has no key to see answers "error": recorded when it declares
    nothing, a failure when it declares zeros, agreement when it declares "error"."""
    assert ask(S.test_empty_sizes, fn, "float64") == ("recorded", dict(
        question="empty_sizes", observed="error", declared=None, agrees=None))
    verdict, row, failure = ask(S.test_empty_sizes, _declared(fn, fully_masked="zeros"), "float64", full=True)
    assert (verdict, row["observed"], row["declared"], row["agrees"]) == ("failed", "error", "zeros", False)
    assert failure.verdict.message == (f"{fn.__name__} declares fully_masked = 'zeros' but at float64 empty sizes "
                                       "does 'error'")
    assert ask(S.test_empty_sizes, _declared(fn, fully_masked="error"), "float64")[0] == "passed"


@pytest.mark.slow
def test_empty_sizes_a_declared_raise_at_no_keys_fails_in_the_suite(tmp_path):
    result = run_suite(["tests.plugins.planted:raises_at_no_keys_declared_zeros",
                        "tests.plugins.planted:raises_at_no_keys"], json_path=str(tmp_path / "out.json"),
                       extra_args=["-k", "empty_sizes", "-n", "0"], profile="dev", cwd=str(tmp_path),
                       pythonpath=[ROOT], timeout=600)
    status = {(r["backend"].split(":")[1], r["dtype"]): r["status"] for r in result.conformance}
    assert status == {("raises_at_no_keys_declared_zeros", "float64"): "failed",
                      ("raises_at_no_keys_declared_zeros", "float32"): "failed",
                      ("raises_at_no_keys", "float64"): "recorded", ("raises_at_no_keys", "float32"): "recorded"}, \
        result.output[-3000:]
    assert result.returncode == 1


# ---- what a plain function is handed ------------------------------------------------------------------

def test_a_bias_with_is_causal_reaches_a_plain_function_as_one_float_mask_with_the_triangle_folded_in():
    backend = resolve("tests.plugins.planted:records_calls")
    assert not backend.capabilities.mask_with_causal and "bias" in backend.capabilities.features
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, L, 4)) for L in (3, 4, 4))  # (B, H, L, E)
    bias = rng.standard_normal((3, 4))  # (Lq, Lk)
    hidden = ~np.tri(3, 4, dtype=bool)  # (Lq, Lk) top-left causal hides j > i
    planted.CALLS.clear()
    out = backend.forward(q, k, v, None, True, None, "float64", bias=bias)  # (B, H, Lq, Ev)
    ((is_causal, dtype, mask),) = planted.CALLS
    assert is_causal is False and dtype == np.float64  # one float mask, never with is_causal=True
    assert np.all(np.isneginf(mask[..., hidden])) and np.array_equal(mask[..., ~hidden], np.broadcast_to(
        bias, mask.shape)[..., ~hidden])
    expected = _attention(q, k, v, None, True, None)  # (B, H, Lq, Ev) no bias: compare with the bias added
    s = (q @ np.swapaxes(k, -1, -2)) / 2 + bias  # (B, H, Lq, Lk)
    w = np.exp(np.where(hidden, -np.inf, s) - s.max(-1, keepdims=True))  # (B, H, Lq, Lk)
    assert np.allclose(out, (w / w.sum(-1, keepdims=True)) @ v) and not np.allclose(out, expected)
    # a boolean mask too: its hidden pairs are -inf in the same float mask
    mask_in = np.ones((3, 4), dtype=bool)  # (Lq, Lk)
    mask_in[2, 0] = False
    planted.CALLS.clear()
    backend.forward(q, k, v, mask_in, True, None, "float64", bias=bias)
    ((is_causal, dtype, mask),) = planted.CALLS
    assert is_causal is False and dtype == np.float64
    assert np.array_equal(np.isneginf(mask[..., :, :]).reshape(-1, 3, 4)[0], hidden | ~mask_in)
    # a boolean mask without a bias: one boolean mask, the triangle folded in
    planted.CALLS.clear()
    backend.forward(q, k, v, mask_in, True, None, "float64")
    ((is_causal, dtype, mask),) = planted.CALLS
    assert is_causal is False and dtype == np.bool_ and np.array_equal(np.asarray(mask).reshape(-1, 3, 4)[0],
                                                                        ~hidden & mask_in)
    # is_causal alone reaches it as is_causal
    planted.CALLS.clear()
    backend.forward(q, k, v, None, True, None, "float64")
    assert planted.CALLS == [(True, None, None)]


def test_the_suites_bias_properties_never_hand_a_plain_function_a_mask_with_is_causal():
    target = Target(Session(resolve("tests.plugins.planted:records_calls"), "tests.plugins.planted:records_calls"),
                    "float64")
    from attnspec.properties import test_bias, test_masking

    planted.CALLS.clear()
    for test in (test_bias.test_additive_bias_matches_reference, test_bias.test_neg_inf_bias_equals_boolean_mask,
                 test_masking.test_zero_future_mass):
        assert explore(test.property, target, Exploration(examples=25, seed=3)) is None, test.__name__
    assert planted.CALLS and not [c for c in planted.CALLS if c[0] and c[1] is not None]
    assert any(c[1] == np.float64 for c in planted.CALLS) and any(c[0] for c in planted.CALLS)
