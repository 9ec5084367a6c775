"""Family: fp8 inputs with descales (issue 31) - run at a backend's float8_e4m3fn / float8_e5m2 targets.

Every other family runs at fp8 targets too, on quantised draws (properties/fp8_draws.py) judged by
the budget of the declared computation (`specs.error_budget`, FP8).  These properties check what
only fp8 has: the descales (x = x_fp8 * descale per batch element and KV head) and the rounding of
P before P V.  Bugs they catch: descales dropped (vllm-project/vllm#51363: garbage for per-head FP8
checkpoints; FlashInfer's ragged wrapper "does not apply k_scale/v_scale"), applied twice, read per
tensor where per head is declared, read from the wrong head or batch element
(sgl-project/sglang#37785), P not rounded where FA3 rounds it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from attnspec.properties.case import Case
from attnspec.properties.draws import row_seed
from attnspec.properties.explore import prop
from attnspec.properties.judge import agreement, output_tolerance, require, shown, verdict, worst
from attnspec.properties.test_semantics import _answer
from attnspec.specs import error_budget, reference
from attnspec.specs.fp8 import FP8_DTYPE_NAMES, Fp8Computation, computation, is_fp8
from attnspec.specs.plain import Fp8Plain
from attnspec.specs.reference import run_forward

if TYPE_CHECKING:
    from attnspec.properties.target import Target

_DESCALE = ("descale",)
# what a kernel may round P to before P V: not at all, the fp8 formats, the query's 16-bit dtypes
P_CANDIDATES = ("float32",) + FP8_DTYPE_NAMES + ("bfloat16", "float16")


def _fp8_only(target: Target) -> None:
    import pytest
    if not is_fp8(target.dtype):
        pytest.skip(f"the fp8 family runs at float8 dtypes ({target.dtype} is not one)")


def _near_exact(name: str, got, want, rows, target: Target, what: str) -> None:
    """Two outputs a power of two apart in the descales must agree to the output's rounding: the same
    products up to powers of two, which every binary format carries exactly (one rounding of each side
    at most: 2 u_out |y| + tau_out), unless a value leaves the formats' range."""
    b = error_budget._budget(target.budget_dtype)
    u_out, tau = (b.out_roundoff, b.out_normal_min) if b.out_roundoff else (b.unit_roundoff, b.normal_min)
    tol = 2 * u_out * np.abs(want) + 2 * tau + 8 * b.accumulate_roundoff * np.abs(want)  # float32 steps around
    where, amount = worst(excess := np.abs(got - want) - tol, np.broadcast_to(rows[..., None], np.shape(got)))
    require(verdict(name, amount <= 0, where if amount > 0 else None, amount,
                    f"{what}: output at {where} (batch, head, query, column) off by {shown(excess, where, amount)} beyond "
                    f"2 roundings of the output", 0.0))


def _powers(draw, case: Case, target: Target) -> dict:
    return {"which": ("q", "k", "v")[draw(st.integers(0, 2), label="descale doubled")],
            "power": (-2, -1, 1, 2)[draw(st.integers(0, 3), label="power of two")]}


@prop(requires=_DESCALE, params=_powers)
def test_descale_powers_of_two(target: Target, case: Case, params: dict):
    """q's or k's descale times 2^j with the softmax scale over 2^j: the same scores, the same output;
    v's descale times 2^j: the output times 2^j - near exactly (a dropped or doubled descale fails)."""
    _fp8_only(target)
    name, j = params["which"], params["power"]
    d = case.fields.get(f"{name}_descale")
    assume(d is not None)  # a 16-bit query beside fp8 K/V has none
    base = target.forward(case)  # (B, H, Lq, Ev)
    scale = case.scale if case.scale is not None else 1.0 / np.sqrt(case.dims["E"])
    moved = {f"{name}_descale": np.asarray(d) * 2.0**j}
    if name != "v":
        moved["scale"] = float(scale * 2.0**-j)
    other = case.replace(**moved)
    out = target.forward(other)
    factor = 2.0**j if name == "v" else 1.0
    _near_exact("descale_powers_of_two", out, factor * base, case.judged_rows(), target,
                f"{name}_descale x 2^{j}" + ("" if name == "v" else f", scale / 2^{j}"))


def _which(draw, case: Case, target: Target) -> dict:
    return {"which": ("q", "k", "v")[draw(st.integers(0, 2), label="descale changed")],
            "factor": (4.0, 0.25, 3.0)[draw(st.integers(0, 2), label="factor")]}


@prop(requires=_DESCALE, params=_which)
def test_descales_not_inert(target: Target, case: Case, params: dict):
    """A descale times 4, 1/4 or 3 (not a power of two the scale could absorb) changes the output as the
    reference says - on problems where the change is more than the budget can hide."""
    _fp8_only(target)
    d = case.fields.get(f"{params['which']}_descale")
    assume(d is not None)
    other = case.replace(**{f"{params['which']}_descale": (np.asarray(d) * params["factor"])})
    rows = case.judged_rows()  # (B, H, Lq)
    moved = np.abs(reference.forward(other.problem).output - reference.forward(case.problem).output)  # (B, H, Lq, Ev)
    assume(worst(moved, np.broadcast_to(rows[..., None], moved.shape))[1]
           > 2 * (output_tolerance(case, target) + output_tolerance(other, target)))
    agreement(target, other)


def _one_head(draw, case: Case, target: Target) -> dict:
    B, Hkv = case.dims["B"], case.dims["Hkv"]
    return {"b": draw(st.integers(0, B - 1), label="batch element"), "g": draw(st.integers(0, Hkv - 1), label="KV head"),
            "which": ("k", "v")[draw(st.integers(0, 1), label="descale changed")]}


@prop(requires=_DESCALE, params=_one_head)
def test_descale_per_kv_head(target: Target, case: Case, params: dict):
    """One (batch element, KV head)'s descale times 4: its query group's rows follow the reference, every
    other row stays within its budget of the output before (a descale read per tensor, or from another
    head or batch element, fails)."""
    _fp8_only(target)
    import pytest
    if target.caps.descale_granularity != "head":
        pytest.skip(f"{target.name} takes one descale per tensor (Capabilities.descale_granularity)")
    name, b, g = f"{params['which']}_descale", params["b"], params["g"]
    d = np.broadcast_to(np.asarray(case.fields[name], dtype=np.float64), (case.dims["B"], case.dims["Hkv"])).copy()
    d[b, g] *= 4.0
    other = case.replace(**{name: d})
    before = target.forward(case)  # (B, H, Lq, Ev)
    after = agreement(target, other)  # (B, H, Lq, Ev) within the budget of the changed problem
    group = case.group
    heads = np.zeros(case.dims["H"], dtype=bool)
    heads[g * group:(g + 1) * group] = True
    rest = case.judged_rows().copy()  # (B, H, Lq)
    rest[b, heads] = False  # the changed group's rows move; the others must not
    atol = output_tolerance(case, target) + output_tolerance(other, target)
    where, amount = worst(diff := np.abs(after - before), np.broadcast_to(rest[..., None], before.shape))
    require(verdict("descale_per_kv_head", amount <= atol, where, amount,
                    f"{name}[{b}, {g}] x 4 moved the output at {where} (batch, head, query, column), outside that "
                    f"KV head's query group, by {shown(diff, where, amount)} (allowed {atol:.3g}: both budgets)", atol))


# ---- what P is rounded to before P V --------------------------------------------------------

def p_probe(target: Target) -> Case:
    """Rows of two score levels, 0 then -x (x = 2^-8 c, c on the fp8 grid in [1, 120]: P = e^-x below 1)
    and V = (-1, 1): the output (P - 1) / (1 + P) is small, so each candidate rounding of P moves it by far
    more than the output's own rounding.  The row maximum comes first, in one key block: every kernel
    rounds the same P (a later maximum would rescale P after rounding)."""
    E = target.caps.fit_head_dim(8)
    Lk = max(2, target.caps.fit_length(2))
    c = np.array([1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0,
                  10, 12, 14, 18, 20, 22, 26, 28, 36, 44, 52, 60, 72, 88, 104, 120])  # (32,) P from 0.996 to 0.63
    Lq = target.caps.fit_length(len(c))
    q = np.zeros((1, 1, Lq, E))
    q[0, 0, :, 0] = np.resize(c, Lq)
    k = np.zeros((1, 1, Lk, E))
    k[0, 0, 1:, 0] = -1.0  # key 0 scores 0, the others -x
    v = np.ones((1, 1, Lk, E))
    v[0, 0, 0, :] = -1.0
    ones = np.ones((1, 1)) if target.caps.descale_granularity == "head" else np.array(1.0)  # (B, Hkv) or per tensor
    fields = dict(q_descale=ones, k_descale=ones, v_descale=ones)
    if not is_fp8(target.query_dtype):  # a 16-bit query beside fp8 K/V comes without a descale
        del fields["q_descale"]
    return target.exact(Case(q, k, v, scale=2.0**-8, fields=fields))


def emulated(target: Target, case: Case, p_dtype: str) -> np.ndarray:
    """The output of the target's declared computation with P rounded to p_dtype (float32: not rounded)."""
    c = computation(target.fp8_computation("float32"))
    kernel = Fp8Computation(c.inputs, None if p_dtype == "float32" else p_dtype, c.out, c.query)
    return run_forward(case.problem, Fp8Plain(kernel)).output  # (B, H, Lq, Ev)


def p_rounding_of(target: Target, out, case: Case) -> tuple:
    """(the candidate P dtype whose emulation is nearest the output, its max distance; every distance)."""
    far = {p: float(np.max(np.abs(out - emulated(target, case, p)))) for p in P_CANDIDATES}
    best = min(far, key=far.get)
    return best, far


@prop(requires=_DESCALE, grid=lambda target: [(p_probe(target) if is_fp8(target.dtype) else None, {})])
def test_p_rounding(target: Target, case: Case, params: dict):
    """What P is rounded to before P V: Semantics.p_dtypes judged (FA3 rounds it to e4m3; a kernel that
    declares so and keeps float32 fails), recorded where not declared."""
    _fp8_only(target)
    observed = _p_rounded_as(target, target.forward(case), case)  # (1, 1, Lq, Ev)
    _answer(target, "p_dtype", observed, target.backend.semantics.p_dtype(target.dtype), "p_rounding")


def _p_rounded_as(target: Target, out, case: Case) -> str:
    """The candidate P dtype the output shows; the declared one where it is within its emulation's budget."""
    observed, _ = p_rounding_of(target, out, case)
    declared = target.backend.semantics.p_dtype(target.dtype)
    allowed = error_budget.forward_allowed_rows(case.problem, dtype=target.fp8_computation("float32"))[0]  # (1, 1, Lq)
    if declared is not None and observed != declared:
        gap = np.abs(out - emulated(target, case, declared)) - allowed[..., None]
        if gap.max() <= 0:  # within the declared emulation's budget: the nearest is a near tie
            observed = declared
    return observed


def _format_probes(target: Target) -> list:
    """The P-rounding probe once a format call the backend declares besides its padded one (packed, each paged
    layout's first): a paged path may keep a P format of its own."""
    if not is_fp8(target.dtype) or "padded" not in target.caps.formats:
        return [(None, {})]  # without a padded call every call is a format call: test_p_rounding's probe went there
    fmts = [f for f in target.caps.formats if f == "packed"] + [f for f in target.caps.formats if f.startswith("paged-")][:1]
    probe = p_probe(target).replace(positions="per_sequence")
    return [(probe, {"format": f}) for f in fmts] or [(None, {})]


@prop(requires=_DESCALE + ("seq_positions",), grid=_format_probes)
def test_p_rounding_in_format_calls(target: Target, case: Case, params: dict):
    """The probe as a packed or paged call: P rounded as the padded call rounds it (as declared, where declared) -
    a paged decode kernel with its own P format (e5m2 for an e4m3 cache) fails."""
    import pytest

    from attnspec.properties import serving_calls as S
    _fp8_only(target)
    if "format" not in params:
        pytest.skip(f"{target.name} takes no padded call or no format call beside one: test_p_rounding's probe "
                    "went through its format")
    fmt = params["format"]
    out = S.packed(target, case) if fmt == "packed" else S.paged(target, case, 16, fmt.split("-", 1)[1])
    observed, padded = _p_rounded_as(target, out, case), _p_rounded_as(target, target.forward(case), case)
    declared = target.backend.semantics.p_dtype(target.dtype)
    want = padded if declared is None else declared
    require(verdict("p_rounding_in_format_calls", observed == want, None, float("nan"),
                    f"{target.name}'s {fmt} call rounds P as {observed}, its padded call as {padded} (declared: "
                    f"{declared!r}) at {target.dtype}"))


def _split_kv_descales(target: Target) -> list:
    """A decode and 16 queries against 1000 keys (a split-KV path), descales that differ per (batch element,
    KV head) where the backend takes them so (one a tensor otherwise), grouped heads where it takes them."""
    if not is_fp8(target.dtype):
        return [(None, {})]
    per_head = target.caps.descale_granularity == "head"
    H, Hkv, E, Lk = (4 if target.supports("gqa") else 2), 2, 64, 1000
    rng = np.random.default_rng(34)
    out = []
    for label, B, Lq in (("decode", 2, 1), ("16 queries", 1, 16)):
        if target.caps.outside(E, E, Lq, Lk, False):
            continue
        q, k, v = (8 * rng.standard_normal(s) for s in ((B, H, Lq, E), (B, Hkv, Lk, E), (B, Hkv, Lk, E)))
        fields = {f"{x}_descale": rng.uniform(0.02, 0.2, (B, Hkv) if per_head else ()).astype(np.float32).astype(float)
                  for x in "qkv" if x != "q" or is_fp8(target.query_dtype)}  # a 16-bit query has no descale
        if H != Hkv:
            fields["enable_gqa"] = True
        out.append((target.exact(Case(q, k, v, None, False, None, fields, label=f"{label} against {Lk} keys, descales "
                                      f"per {'(batch, KV head)' if per_head else 'tensor'}")), {}))
    return out or [(None, {})]


@prop(requires=_DESCALE, grid=_split_kv_descales)
def test_descales_on_split_kv_paths(target: Target, case: Case, params: dict):
    """The descales on a split-KV path (few queries against long keys: a kernel of its own that may apply
    v_descale to each split and again after the combine, or drop one): the output against the reference."""
    _fp8_only(target)
    if case is None:
        import pytest
        pytest.skip(f"{target.name} declares limits that leave out 1000 keys")
    agreement(target, case)


# the forms of a per-head descale that broadcast to (B, Hkv), the values each holds: one a batch element,
# one a KV head (shared by the batch), the same with the batch axis kept at 1
_COMPACT_DESCALES = {"(B, 1)": (2, 1), "(1, Hkv)": (1, 2), "(Hkv,)": (2,)}


def _compact_descales(target: Target) -> list:
    """Descales in each form that broadcasts to (B, Hkv) = (2, 2) - (B, 1), (1, Hkv), (Hkv,) - entries a factor
    of 2 to 10 apart: a kernel that reads any descale with dense (B, Hkv) strides reads the wrong entry (or
    past the end) wherever the form is not (B, Hkv), and the draws' calibrated descales differ too little
    between batch elements to show it."""
    if not is_fp8(target.dtype) or target.caps.descale_granularity != "head":
        return [(None, {})]
    H, Hkv, B = (4 if target.supports("gqa") else 2), 2, 2
    out = []
    for form, shape in _COMPACT_DESCALES.items():
        label = f"descales shaped {form}, B 2, {H} query heads on 2 KV heads"
        rng = np.random.default_rng(row_seed(label))
        q, k, v = (8 * rng.standard_normal(s) for s in ((B, H, 5, 16), (B, Hkv, 37, 16), (B, Hkv, 37, 16)))
        firsts = rng.uniform(0.02, 0.05, 3)  # each descale's entries: its first, then 2 to 10 times it
        fields = {f"{x}_descale": (first * np.array([1.0, rng.uniform(2.0, 10.0)]).reshape(shape))
                  .astype(np.float32).astype(float) for x, first in zip("qkv", firsts, strict=True)
                  if x != "q" or is_fp8(target.query_dtype)}  # a 16-bit query has no descale
        if H != Hkv:
            fields["enable_gqa"] = True
        out.append((target.exact(Case(q, k, v, None, False, None, fields, label=label)), {}))
    return out


@prop(requires=_DESCALE, grid=_compact_descales)
def test_descale_shapes_broadcast(target: Target, case: Case, params: dict):
    """A per-head descale in a form that broadcasts to (B, Hkv) - (B, 1), (1, Hkv), (Hkv,) - means what its
    broadcast does (specs.fields): the output against the reference."""
    _fp8_only(target)
    if case is None:
        import pytest
        pytest.skip(f"{target.name} takes one descale per tensor (Capabilities.descale_granularity)")
    agreement(target, case)
