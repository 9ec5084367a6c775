"""The semantics profile: what each backend does where the spec leaves a choice, in every dtype.

One test per question and dtype (``test_fully_masked_rows[numpy-naive-float32]``).  A declared
answer (`backends.base.Semantics`, or `backends.declare` for a plain function) is judged: a
contradiction fails.  An undeclared one is *recorded* - status ``recorded`` in the JSON, the
terminal summary and pytest's count - and never fails.  Answers are decided with the error
budget of the backend's precision (`specs.error_budget`), never a fixed tolerance; the
output's dtype is a question of its own (``output_dtype``), so a backend returning float32 for
float64 input still answers every other question.  A backend that raises gives the answer
"error"; a problem it declines (``Unsupported``), "declined".
"""
from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import numpy as np

from attnspec.properties.case import Case
from attnspec.properties.explore import prop
from attnspec.properties.judge import Failed, require, verdict
from attnspec.properties.outcomes import deviation_of
from attnspec.properties.target import Declined
from attnspec.specs import error_budget
from attnspec.specs.error_budget import BUDGETS, round_to
from attnspec.specs.fp8 import is_fp8
from attnspec.specs.masks import CAUSAL_ALIGNMENTS

if TYPE_CHECKING:
    from attnspec.properties.target import Target

_SHAPE = (1, 2, 3, 4)  # B, H, Lq (= 3), Lk (= 4)
_E = 4  # E = Ev: suits backends that need Ev == E
ALIGNMENT_SHAPES = ((1, 4), (3, 4), (5, 3))  # (Lq, Lk): a decode step, 1 < Lq < Lk, Lq > Lk


def _problem(target: Target, seed=0, value_offset=0.0, shape=_SHAPE):
    """q, k, v on a grid of k/8 (exact in every format); values offset so a mean is far from zero.
    E = Ev = 4, or the backend's head-dim multiple (cuDNN takes multiples of 8 only)."""
    rng = np.random.default_rng(seed)
    B, H, Lq, Lk = shape
    m = target.caps.head_dim_multiple
    E = -(-_E // m) * m
    q = np.round(rng.standard_normal((B, H, Lq, E)) * 8) / 8  # (B, H, Lq, E)
    k = np.round(rng.standard_normal((B, H, Lk, E)) * 8) / 8  # (B, H, Lk, E)
    v = np.round(rng.standard_normal((B, H, Lk, E)) * 8) / 8 + value_offset  # (B, H, Lk, Ev)
    return Case(q, k, v)


def _run(target: Target, case: Case):
    """(output as float64, the dtype it came back in), ("error", None) when the backend raised, or
    ("declined", reason).  Any other misbehaviour (a wrong shape, a hang) is a failure."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NaN and inf are fed on purpose
            return target.forward_as_returned(case)
    except Failed as f:
        if f.verdict.name == "backend_raised":  # a choice some make for these inputs
            return "error", None
        raise
    except Declined as e:
        return "declined", str(e)


JUDGE = object()  # _answer's default: the answer agrees when it equals the declared one


def _answer(target: Target, question: str, observed: str, declared, prop_name: str, agrees=JUDGE,
            declaration: str | None = None) -> None:
    """Record the answer; a declared one that is contradicted fails (unless declared as a deviation).
    ``agrees``: the question's own judgement (None: not judged); ``declaration``: the declaration
    judging it, when it is not named as the question (empty sizes answer to fully_masked)."""
    if agrees is JUDGE:
        agrees = None if declared is None else observed == declared
    if observed == "declined":  # a probe the backend declines (Unsupported: a causal-only kernel's non-causal
        agrees = None  # one) is recorded, as a declined call is a skip: no contradiction of what it declares
    recorded = agrees
    deviation = deviation_of(target, prop_name, feature=False)
    if agrees is False and deviation is not None:
        recorded = None  # a departure declared at this dtype (its `deviation` row says so): no contradiction
    target.answers.append(dict(backend=target.name, question=question, dtype=target.dtype, observed=observed,
                               declared=declared, agrees=recorded))
    what = declaration or question
    require(verdict(prop_name, agrees is not False, None, float("nan"),
                    f"{target.name} declares {what} = {declared!r} but at {target.dtype} "
                    f"{'' if what == question else question.replace('_', ' ') + ' '}does {observed!r}"))


def _row_answer(target: Target, out, row: int, case, computed=None) -> str:
    """What query `row` holds: nan, zeros, mean_of_values (uniform weights over every key),
    computed (the row as if nothing hid it), or other - each within the dtype's row budget."""
    got = out[..., row, :]  # (B, H, Ev)
    if np.isnan(got).all():
        return "nan"
    if not np.isfinite(got).all():
        return "other"
    q_flat = case.q.copy()
    q_flat[..., row, :] = 0  # equal scores: the reference row is the mean of the values
    allowed, uniform, _ = error_budget.forward_allowed_rows(q_flat, case.k, case.v, dtype=target.budget_dtype)
    limit = allowed[..., row, None]  # (B, H, 1): that row's allowance
    if np.all(np.abs(got) <= limit):
        return "zeros"
    if computed is not None and np.all(np.abs(got - computed[..., row, :]) <= limit):
        return "computed"
    if np.all(np.abs(got - uniform[..., row, :]) <= limit):
        return "mean_of_values"
    return "other"


def _probe(make):
    """A question's grid: its one probe problem, built for the target (exact in its formats: fp8)."""
    return lambda target: [(target.exact(make(target)), {})]


@prop(grid=_probe(_problem))
def test_output_dtype(target: Target, case: Case, params: dict):
    """The dtype results come back in: the input's, unless a policy is declared (output_dtypes)."""
    out, returned = _run(target, case)
    observed = returned if not isinstance(out, str) else out
    _answer(target, "output_dtype", observed, target.backend.output_dtype(target.dtype), "output_dtype")


def _fully_masked_probe(target: Target):
    case = _problem(target, value_offset=2.0)
    mask = np.ones(_SHAPE, dtype=bool)  # (B, H, Lq, Lk)
    mask[..., 1, :] = False  # query 1 sees nothing
    return case.replace(mask=mask)


@prop(needs=("masks",), grid=_probe(_fully_masked_probe))
def test_fully_masked_rows(target: Target, case: Case, params: dict):
    out, _ = _run(target, case)
    observed = out if isinstance(out, str) else _row_answer(target, out, 1, case)
    _answer(target, "fully_masked", observed, target.backend.semantics.fully_masked, "fully_masked_rows")


@prop(requires=("seq_lengths",), grid=_probe(lambda t: _problem(t, value_offset=2.0).replace(
    q_lengths=np.array([2]))))  # query 2 is padding
def test_padded_rows(target: Target, case: Case, params: dict):
    """A query row past q_lengths (backends that take sequence lengths): what it outputs."""
    out, _ = _run(target, case)
    if isinstance(out, str):
        observed = out
    else:
        unpadded = case.replace(q_lengths=None)
        computed = error_budget.forward_allowed_rows(unpadded.problem, dtype=target.budget_dtype)[1]  # (B, H, Lq, Ev)
        observed = _row_answer(target, out, 2, unpadded, computed)
    _answer(target, "padded_rows", observed, target.backend.semantics.padded_rows, "padded_rows")


def _coarser(dtype: str) -> list:
    """dtype, then the float formats coarser than it, finest first (an fp8 kernel's computation: its own
    budget first, then bfloat16's and float16's)."""
    u = error_budget._budget(dtype).unit_roundoff
    coarser = sorted((d for d in BUDGETS if BUDGETS[d].unit_roundoff >= u and d != dtype),
                     key=lambda d: BUDGETS[d].unit_roundoff)
    return [dtype] + coarser if is_fp8(dtype) else sorted(coarser + [dtype], key=lambda d: BUDGETS[d].unit_roundoff)


def alignment_of(target: Target, out, case) -> str:
    """The causal alignment the output follows: the one whose reference it meets within the budget of
    the backend's precision - or the first coarser budget that tells the two apart (a float64 call
    computed in float32 is top-left or bottom-right all the same); 'other' when it meets neither."""
    for fmt in _coarser(target.budget_dtype):
        met = []
        for name in CAUSAL_ALIGNMENTS:
            asked = case.replace(causal_alignment=name)
            if error_budget.check_forward(out, asked.problem, dtype=fmt, rows=asked.judged_rows()):
                met.append(name)
        if len(met) == 1:
            return met[0]
    return "other"


def _causal_probe(target: Target, seed, Lq, Lk):
    """A causal problem asking for the alignment the backend takes (its declared one, else the spec's)."""
    return _problem(target, seed=seed, shape=(1, 2, Lq, Lk)).replace(is_causal=True,
                                                                     causal_alignment=target.alignments[0])


@prop(needs=("causal",), grid=_probe(lambda t: _causal_probe(t, 0, *ALIGNMENT_SHAPES[0])))
def test_causal_alignment(target: Target, case: Case, params: dict):
    """What is_causal does when Lq != Lk, at three shapes: a decode step (Lq = 1 < Lk = 4; top-left
    sees key 0 only, bottom-right every key), Lq = 3 < Lk = 4 and Lq = 5 > Lk = 3.  An answer that
    differs between them is its own answer ("changes with the shape": transformers' SDPA path drops
    is_causal for a one-row query)."""
    if target.supports("causal_bottom_right"):
        import pytest
        pytest.skip(f"{target.name} takes the causal alignment as a parameter "
                    "(both are asked for and judged by test_causal_alignment_as_asked)")
    answers = {}
    for i, (Lq, Lk) in enumerate(ALIGNMENT_SHAPES):
        probe = _causal_probe(target, i, Lq, Lk)
        out, _ = _run(target, probe)
        answers[f"Lq={Lq} Lk={Lk}"] = out if isinstance(out, str) else alignment_of(target, out, probe)
    values = set(answers.values())
    observed = values.pop() if len(values) == 1 else \
        "changes with the shape: " + "; ".join(f"{s}: {a}" for s, a in answers.items())
    _answer(target, "causal_alignment", observed, target.backend.semantics.causal_alignment, "causal_alignment")


def _masked_pair_probe(bad: float, where: str):
    def make(target):
        case = _problem(target)
        mask = np.ones(_SHAPE, dtype=bool)  # (B, H, Lq, Lk)
        mask[..., 2] = False  # key 2 hidden from every query
        x = (case.k if where == "key" else case.v).copy()
        x[..., 2, :] = bad
        return case.replace(mask=mask, **{"k" if where == "key" else "v": x})
    return make


def _masked_pair(bad: float, where: str):
    question = f"masked_{'nan' if math.isnan(bad) else 'inf'}_{where}"

    def check(target, case, params):
        """A NaN/inf in a key or value no query may see: does it reach the output? (0 * NaN = NaN)"""
        if math.isinf(bad) and target.dtype == "float8_e4m3fn":
            import pytest
            pytest.skip("float8_e4m3fn has no infinity (its casts make it NaN: the NaN question asks that)")
        out, _ = _run(target, case)
        observed = out if isinstance(out, str) else ("leaks" if not np.isfinite(out).all() else "no_leak")
        _answer(target, question, observed, None, question)
    check.__name__ = f"test_{question}"
    check.__module__ = __name__
    return prop(needs=("masks",), grid=_probe(_masked_pair_probe(bad, where)))(check)


test_masked_nan_key = _masked_pair(math.nan, "key")
test_masked_nan_value = _masked_pair(math.nan, "value")
test_masked_inf_key = _masked_pair(math.inf, "key")
test_masked_inf_value = _masked_pair(math.inf, "value")


def _nan_query_probe(target: Target):
    case = _problem(target)
    q = case.q.copy()
    q[0, 0, 0, 0] = math.nan
    return case.replace(q=q)


@prop(grid=_probe(_nan_query_probe))
def test_nan_in_unmasked_query(target: Target, case: Case, params: dict):
    """NaN in query 0: only row 0 should be NaN; does it spread to other rows or vanish?"""
    out, _ = _run(target, case)
    if isinstance(out, str):
        observed = out
    else:
        nan = np.isnan(out).any(axis=-1)  # (B, H, Lq)
        observed = "row_only" if nan[0, 0, 0] and nan.sum() == 1 else "spreads" if nan.sum() > 1 else "swallowed"
    _answer(target, "nan_query", observed, None, "nan_in_unmasked_query")


def _precision_probe(target: Target):
    rng = np.random.default_rng(1)
    q, k, v = (np.asarray(round_to(rng.standard_normal((1, 2, 64, 64)), target.dtype), dtype=np.float64)
               for _ in range(3))  # (B, H, L, E), exact in the dtype
    return Case(q, k, v)


@prop(grid=_probe(_precision_probe))
def test_effective_precision(target: Target, case: Case, params: dict):
    """The widest format whose error budget the results meet (float64 input computed in float32: float32)."""
    if is_fp8(target.dtype):
        import pytest
        pytest.skip("fp8 inputs: the precision is the declared computation's (output_dtype, test_fp8's p_rounding)")
    out, _ = _run(target, case)
    observed = out if isinstance(out, str) else "worse than bfloat16"
    if not isinstance(out, str):
        u = BUDGETS[target.dtype].unit_roundoff
        for fmt in sorted((d for d in BUDGETS if BUDGETS[d].unit_roundoff >= u), key=lambda d: BUDGETS[d].unit_roundoff):
            if error_budget.check_forward(out, case.problem, dtype=fmt):
                observed = fmt
                break
    semantics = target.backend.semantics
    declared_any = semantics.effective_precision or target.backend.output_dtype(target.dtype) != target.dtype
    declared = target.budget_dtype if declared_any else None
    # a declared precision is a floor on the error allowed, not a promise of that error: results
    # more accurate than declared agree with it; only worse ones contradict
    agrees = None if declared is None else (observed in BUDGETS and
                                            BUDGETS[observed].unit_roundoff <= BUDGETS[declared].unit_roundoff)
    _answer(target, "effective_precision", observed, declared, "effective_precision", agrees)


EMPTY_SIZES = (("Lk=0", (1, 2, 3, 0)), ("Lq=0", (1, 2, 0, 4)), ("batch 0", (0, 2, 3, 4)))


def empty_answer(answers: dict, declared):
    """(observed, agrees) of the empty-sizes question: a row that sees nothing, at its limit.

    Lk = 0: every row sees nothing (zeros | nan | other | error); Lq = 0 and batch 0: no row at all
    (empty | error).  Declared `fully_masked` judges them: Lk = 0 must give it (a mean of no
    values is undefined: anything but an error; "nan": zeros too, an empty sum), and only a backend
    declaring "error" may raise."""
    kinds, lk = set(answers.values()), answers["Lk=0"]
    if lk in ("zeros", "nan", "error") and kinds <= {lk, "empty"}:  # the rows' answer; no row at all is empty
        observed = lk
    else:
        observed = "; ".join(f"{s}: {a}" for s, a in answers.items())
    if declared is None or "declined" in kinds:
        return observed, None
    rest = [answers[s] for s in ("Lq=0", "batch 0")]
    if declared == "error":
        return observed, answers["Lk=0"] == "error" and all(a in ("error", "empty") for a in rest)
    lk = answers["Lk=0"]
    # NaN for a masked row comes from 0/0 in its weights; with Lk = 0 there are no weights, and P V sums no
    # product: zeros (a textbook softmax(s) @ v, flash-attention's attention_ref) - also the "nan" answer
    agrees = lk != "error" if declared == "mean_of_values" else lk == declared or (declared, lk) == ("nan", "zeros")
    return observed, agrees and "error" not in rest


def _empty_probe(target: Target):
    return _problem(target, shape=EMPTY_SIZES[0][1])


@prop(grid=_probe(_empty_probe))
def test_empty_sizes(target: Target, case: Case, params: dict):
    """Lk = 0, Lq = 0 and batch 0: the right (empty) shape back, in the dtype a call with rows returns, and for
    Lk = 0 the rows that see nothing - or an error, which is an answer too (recorded when undeclared, judged
    when declared)."""
    answers, wrong_dtype = {}, {}
    out, usual = _run(target, _problem(target))  # the dtype of a call with rows (test_output_dtype's probe)
    usual = None if isinstance(out, str) else usual  # raised or declined: its reason is no dtype to compare with
    for label, shape in EMPTY_SIZES:
        out, returned = _run(target, _problem(target, shape=shape))  # a wrong shape is a failure, not an answer
        if isinstance(out, str):
            answers[label] = out
            continue
        if usual is not None and returned != usual:  # an early return that allocates its own (empty) output
            wrong_dtype[label] = returned
        if label != "Lk=0" or out.size == 0:
            answers[label] = "empty"
        else:
            answers[label] = "nan" if np.isnan(out).all() else "zeros" if np.all(out == 0) else "other"
    observed, agrees = empty_answer(answers, target.backend.semantics.fully_masked)
    _answer(target, "empty_sizes", observed, target.backend.semantics.fully_masked, "empty_sizes", agrees,
            declaration="fully_masked")
    require(verdict("empty_sizes", not wrong_dtype, None, float("nan"),
                    f"the output at {', '.join(wrong_dtype)} came back as {', '.join(sorted(set(wrong_dtype.values())))}; "
                    f"a call with rows returns {usual}"))
