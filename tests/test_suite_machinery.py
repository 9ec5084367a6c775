"""The suite's own machinery: drawn inputs are exact, a Case's transforms give the problems their
definitions say, reproducers rebuild the arrays bit for bit and print the suite's verdict in a
fresh process, bad input is refused by name.

These are the harness's self-tests: they live in tests/, never in the user's `pytest properties`
(a conformance verdict must never depend on them).  Nothing here turns text into code in this
process: literals and reproducers are run as scripts, in a fresh interpreter.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnspec.backends.registry import resolve
from attnspec.properties import draws, repro
from attnspec.properties.case import Case, seed_case
from attnspec.properties.draws import SCORE_CAP, draw_case, score_terms
from attnspec.properties.explore import Counterexample, attempt
from attnspec.properties.plugin import make_targets
from attnspec.properties.results import headline, verdict_lines
from attnspec.properties.runner import SuiteError, run_suite
from attnspec.properties.target import Target
from attnspec.specs import fields as F
from attnspec.specs import reference
from attnspec.specs.plain import round_to
from tests._helpers import target_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = ("float16", "bfloat16", "float32", "float64")
_SMALLEST_NORMAL = {"float16": 2.0**-14, "bfloat16": 2.0**-126, "float32": 2.0**-126, "float64": 2.0**-1022}
# fields tied to positions (a window, ALiBi distances, lengths) do not move with permuted or cut keys
POSITIONAL = F.POSITIONAL
# the float64 reference summing the same terms in another order (keys permuted or cut): measured at
# most 9e-16 relative on 200 draws; a wrong permutation or cut is off by O(1)
REORDERED = 1e-12


def target(dtype: str) -> Target:
    """numpy-naive (every optional feature) at any dtype: draws only read its capabilities and the
    dtype; Ev != E is known to be taken, so no call is made."""
    return target_of(resolve("numpy-naive"), dtype, equal_dims=False)


def exact_in(x: np.ndarray, dtype: str) -> bool:
    return np.array_equal(np.asarray(round_to(x, dtype), dtype=np.float64), x)


def close(a, b, scale=1.0) -> bool:
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= REORDERED * max(1.0, scale)))


# ---- drawn inputs -------------------------------------------------------------------------

@settings(max_examples=80, database=None, deadline=None)
@given(dtype=st.sampled_from(DTYPES), data=st.data())
def test_drawn_inputs_are_exact_normal_numbers_of_the_dtype(dtype, data):
    """Every input a backend is given is exactly representable in the dtype and a normal number of
    it (the adapter's cast loses nothing); the largest score term stays at or below the dtype's cap;
    the optional fields validate."""
    case = draw_case(data.draw, target(dtype))
    for name in ("q", "k", "v"):
        x = getattr(case, name)
        assert x.dtype == np.float64 and exact_in(x, dtype), name
        nonzero = np.abs(x[x != 0])
        assert nonzero.size == 0 or nonzero.min() >= _SMALLEST_NORMAL[dtype], f"{name} has a subnormal {nonzero.min()}"
    if "bias" in case.fields:
        b = case.fields["bias"]
        assert exact_in(b[np.isfinite(b)], dtype) and not np.isposinf(b).any()
    scale = case.scale if case.scale is not None else 1 / np.sqrt(case.dims["E"])
    assert score_terms(case.q, case.k, scale, case.group) <= SCORE_CAP[dtype]
    assert set(case.fields) <= set(F.NAMES)
    assert case.problem is not None  # validates: a ValueError naming the field otherwise


@settings(max_examples=60, database=None, deadline=None)
@given(data=st.data())
def test_drawn_fields_hold_no_off_value(data):
    """Case.fields holds the optional fields that are not off (properties/case.py): a field at its off
    value is no field - a drawn case must not pass one on (causal_alignment="top_left" included)."""
    case = draw_case(data.draw, target("float64"), kinds=("causal",))
    assert not [n for n, x in case.fields.items() if not isinstance(x, np.ndarray) and x == F.OFF[n]], case.fields


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_amplitude_handles_the_formats_extremes(dtype):
    """A key at the smallest normal number: the goal/S ratio overflows float64 (it raised
    OverflowError inside a draw); the amplitude still lands the scores at or below the cap."""
    tiny = float(np.finfo(dtype).tiny)
    q, k = np.array([[[[0.0], [1.0]]]]), np.array([[[[0.0], [tiny]]]])  # (1, 1, 2, 1)

    @settings(max_examples=20, database=None, deadline=None)
    @given(st.data())
    def check(data):
        j = draws.amplitude(data.draw, dtype, q, k, 1.0, 1)
        assert score_terms(q * 2.0**j, k * 2.0**j, 1.0) <= SCORE_CAP[dtype]
        assert exact_in(q * 2.0**j, dtype) and exact_in(k * 2.0**j, dtype)

    check()


def test_score_terms_is_the_largest_scaled_product_of_magnitudes_over_the_group():
    """S = max scale |q|.|k| over every (query, key) pair, query head h reading KV head h // group."""
    q = np.array([1.0, -2.0, 0.5, 3.0]).reshape(1, 2, 1, 2)  # (B, Hq = 2, Lq = 1, E = 2)
    k = np.array([[-1.0, 1.0], [4.0, 0.0]]).reshape(1, 1, 2, 2)  # (B, Hkv = 1, Lk = 2, E = 2)
    # head 0: |q| = (1, 2): keys 1*1 + 2*1 = 3, 1*4 = 4; head 1: |q| = (0.5, 3): 0.5 + 3 = 3.5, 2
    assert score_terms(q, k, 0.5, group=2) == 0.5 * 4.0
    assert score_terms(q[:, :0], k, 1.0) == 0.0  # nothing to multiply


def test_amplitude_lands_the_largest_score_term_where_the_draw_asks():
    """Each score size of draws.AMPLITUDES (saturating: the dtype's cap; moderate; tiny) puts S scaled by
    4^j within a factor of 4 below its goal, never above the cap."""
    q = np.array([0.25, 0.5]).reshape(1, 1, 1, 2)  # (B, H, Lq, E)
    k = np.array([0.5, 0.75]).reshape(1, 1, 1, 2)  # S = 0.5
    for i, (_, log2_goal) in enumerate(draws.AMPLITUDES):
        for dtype in DTYPES:
            j = draws.amplitude(lambda strategy, label=None, i=i: i, dtype, q, k, 1.0, 1)  # the i-th score size
            goal = SCORE_CAP[dtype] if log2_goal is None else min(2.0**log2_goal, SCORE_CAP[dtype])
            s = score_terms(q * 2.0**j, k * 2.0**j, 1.0)
            assert goal / 4 < s <= goal <= SCORE_CAP[dtype], (i, dtype, j, s)


# ---- transforms: the problems their definitions say -------------------------------------------

@settings(max_examples=40, database=None, deadline=None)
@given(data=st.data())
def test_without_grouped_heads_is_the_same_problem(data):
    """without("gqa"): K/V repeated per query head (PyTorch's repeat_interleave, head h reads KV head
    h // group), grouping off - the reference computes the very same output, LSE and weights."""
    case = draw_case(data.draw, target("float64"), need={"gqa"})
    g = case.group
    assert g > 1 and case.fields["enable_gqa"] is True and "gqa" in case.features
    flat = case.without("gqa")
    assert flat.dims["Hkv"] == flat.dims["H"] == case.dims["H"] and "enable_gqa" not in flat.fields
    assert "gqa" not in flat.features and flat.features == case.features - {"gqa"}
    for h in range(case.dims["H"]):
        assert np.array_equal(flat.k[:, h], case.k[:, h // g]) and np.array_equal(flat.v[:, h], case.v[:, h // g])
    grouped, repeated = reference.forward(case.problem), reference.forward(flat.problem)
    for name in ("output", "lse", "weights", "visible"):
        assert np.array_equal(getattr(grouped, name), getattr(repeated, name)), name


def test_without_per_sequence_positions_turns_off_its_fields_only():
    """seq_positions is not drawn by draw_case (its families add it): without() on a case that has it."""
    from attnspec.properties.case import Case
    z = np.zeros((2, 1, 3, 2))
    case = Case(z, z, z, None, True, None, {"positions": "per_sequence", "kv_starts": np.array([1, 0]),
                                            "kv_lengths": np.array([3, 2]), "causal_alignment": "bottom_right"})
    off = case.without("seq_positions")
    assert "seq_positions" not in off.features and set(off.fields) == {"kv_lengths", "causal_alignment"}


@pytest.mark.parametrize("feature", [f for f in F.FEATURES if f not in ("gqa", "lse") and f not in F.SERVING_FEATURES])
def test_without_a_feature_turns_off_its_fields_only(feature):
    """without(feature): that feature's fields at their off value (removed), every other field untouched."""
    seen = []

    @settings(max_examples=15, database=None, deadline=None)
    @given(data=st.data())
    def check(data):
        need = {feature} if feature != "causal_bottom_right" else set()
        case = draw_case(data.draw, target("float64"), need=need, kinds=("causal",) if not need else draws.MASK_KINDS)
        if feature not in case.features:  # bottom-right: where Lq != Lk and the alignment was drawn so
            return
        seen.append(case)
        off = case.without(feature)
        assert feature not in off.features
        assert not set(F.FIELDS_OF[feature]) & set(off.fields)
        assert {n: x for n, x in case.fields.items() if n not in F.FIELDS_OF[feature]} == \
               {n: x for n, x in off.fields.items()}  # the same objects
        for name in F.FIELDS_OF[feature]:
            assert getattr(off.problem, name) is F.OFF[name] or getattr(off.problem, name) == F.OFF[name]
        assert all(getattr(off, n) is getattr(case, n) for n in ("q", "k", "v", "mask", "is_causal", "scale"))

    check()
    assert seen, f"no draw used {feature}"


def test_replace_with_an_off_value_removes_the_field():
    q = np.ones((2, 2, 3, 4))  # (B, Hq, Lq, E)
    kv = np.ones((2, 1, 5, 4))  # (B, Hkv, Lk, E)
    case = Case(q, kv, kv).replace(enable_gqa=True, bias=np.zeros((3, 5)), window=(1, 0), softcap=4.0,
                                   q_lengths=np.array([3, 2]), kv_lengths=np.array([5, 1]),
                                   causal_alignment="bottom_right")
    assert set(case.fields) == {"enable_gqa", "bias", "window", "softcap", "q_lengths", "kv_lengths",
                                "causal_alignment"}
    before = dict(case.fields)
    off = case.replace(bias=None, window=None, softcap=None, enable_gqa=False, causal_alignment="top_left",
                       kv_lengths=None, q_lengths=None)
    assert off.fields == {} and off.features == frozenset()
    assert case.fields.keys() == before.keys()  # the original case is untouched
    assert case.replace(softcap=8.0).fields["softcap"] == 8.0
    moved = case.replace(label="x", is_causal=True, scale=0.5)
    assert (moved.label, moved.is_causal, moved.scale) == ("x", True, 0.5) and moved.fields.keys() == before.keys()
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['bais'\]; fields: bias, enable_gqa"):
        case.replace(bais=None)


def test_permuted_moves_mask_bias_and_segment_ids_with_their_rows_and_keys():
    """Hand-made: a 2-D mask, a per-sequence bias and segment ids follow the permuted queries / keys;
    a bias broadcast over queries is not moved by a query permutation."""
    B, H, Lq, Lk, E = 2, 1, 3, 4, 2
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((B, H, Lq, E)), rng.standard_normal((B, H, Lk, E)), rng.standard_normal((B, H, Lk, 3))
    mask = np.arange(Lq * Lk).reshape(Lq, Lk) % 3 != 1  # (Lq, Lk)
    bias = np.arange(B * Lq * Lk, dtype=float).reshape(B, 1, Lq, Lk)
    row_bias = np.arange(Lk, dtype=float).reshape(1, 1, 1, Lk)  # (1, H, 1, Lk)
    qs, ks = np.array([[0, 0, 1], [0, 1, 1]]), np.array([[0, 0, 1, 1], [0, 1, 1, 1]])
    case = Case(q, k, v, mask, False, 0.5, dict(bias=bias, q_segment_ids=qs, kv_segment_ids=ks))
    pq, pk = [2, 0, 1], [3, 1, 0, 2]
    mq, mk = case.permuted("q", pq), case.permuted("k", pk)
    assert np.array_equal(mq.q, q[:, :, pq]) and mq.k is k and mq.v is v
    assert np.array_equal(mq.mask, mask[pq]) and np.array_equal(mq.fields["bias"], bias[:, :, pq])
    assert np.array_equal(mq.fields["q_segment_ids"], qs[:, pq]) and mq.fields["kv_segment_ids"] is ks
    assert np.array_equal(mk.k, k[:, :, pk]) and np.array_equal(mk.v, v[:, :, pk]) and mk.q is q
    assert np.array_equal(mk.mask, mask[:, pk]) and np.array_equal(mk.fields["bias"], bias[..., pk])
    assert np.array_equal(mk.fields["kv_segment_ids"], ks[:, pk]) and mk.fields["q_segment_ids"] is qs
    broad = case.replace(bias=row_bias)
    assert broad.permuted("q", pq).fields["bias"] is row_bias
    assert np.array_equal(broad.permuted("k", pk).fields["bias"], row_bias[..., pk])


@settings(max_examples=60, database=None, deadline=None)
@given(data=st.data())
def test_permuted_cases_are_the_permuted_problems(data):
    """On drawn problems (fields that move with rows and keys; the causal triangle made a mask
    first): the visible pairs permute exactly, the reference output permutes with the queries and is
    unchanged by a joint key/value permutation."""
    case = draw_case(data.draw, target("float64"), avoid=POSITIONAL).causal_as_mask()
    ref = reference.forward(case.problem)
    pq = list(data.draw(st.permutations(range(case.dims["Lq"])), label="query permutation"))
    pk = list(data.draw(st.permutations(range(case.dims["Lk"])), label="key permutation"))
    mq, mk = reference.forward(case.permuted("q", pq).problem), reference.forward(case.permuted("k", pk).problem)
    vis = np.broadcast_to(ref.visible, mq.visible.shape)
    assert np.array_equal(mq.visible, vis[..., pq, :]) and np.array_equal(mk.visible, vis[..., pk])
    size = float(np.max(np.abs(ref.output), initial=0.0))
    assert close(mq.output, ref.output[..., pq, :], size) and close(mk.output, ref.output, size)


@settings(max_examples=60, database=None, deadline=None)
@given(data=st.data())
def test_keys_is_the_problem_over_those_keys(data):
    """keys(lo, hi): keys lo..hi-1 with their values and the mask's, bias's and segment ids' columns -
    the same visible pairs and scores as those columns of the whole problem."""
    case = draw_case(data.draw, target("float64"), avoid=POSITIONAL, kinds=("none", "mask", "empty_rows"))
    Lk = case.dims["Lk"]
    lo = data.draw(st.integers(0, Lk - 1), label="lo")
    hi = data.draw(st.integers(lo + 1, Lk), label="hi")
    part = case.keys(lo, hi)
    assert part.dims["Lk"] == hi - lo and np.array_equal(part.k, case.k[..., lo:hi, :])
    assert np.array_equal(part.v, case.v[..., lo:hi, :])
    if "kv_segment_ids" in case.fields:
        assert np.array_equal(part.fields["kv_segment_ids"], case.fields["kv_segment_ids"][..., lo:hi])
        assert part.fields["q_segment_ids"] is case.fields["q_segment_ids"]
    whole, cut = reference.forward(case.problem), reference.forward(part.problem)
    assert np.array_equal(cut.visible, np.broadcast_to(whole.visible, cut.visible.shape[:-1] + (Lk,))[..., lo:hi])
    s = np.where(cut.visible, cut.scores, 0.0)
    assert close(s, np.where(cut.visible, whole.scores[..., lo:hi], 0.0), float(np.max(np.abs(s), initial=0.0)))


def test_keys_cuts_a_4d_mask_and_leaves_a_bias_broadcast_over_keys():
    q, kv = np.zeros((1, 2, 3, 2)), np.zeros((1, 2, 5, 2))
    mask = np.arange(30).reshape(1, 2, 3, 5) % 4 != 0  # (B, H, Lq, Lk)
    per_query = np.arange(3.0).reshape(3, 1)  # (Lq, 1): the same for every key
    part = Case(q, kv, kv, mask, fields=dict(bias=per_query)).keys(1, 4)
    assert np.array_equal(part.mask, mask[..., 1:4]) and part.fields["bias"] is per_query


@settings(max_examples=40, database=None, deadline=None)
@given(data=st.data())
def test_causal_as_mask_is_the_same_problem(data):
    """The causal triangle (top-left or bottom-right) folded into the boolean mask: the same visible
    pairs and bit-for-bit the same reference output; a case that is not causal is returned as is."""
    case = draw_case(data.draw, target("float64"), kinds=("causal", "causal_mask"))
    folded = case.causal_as_mask()
    assert case.is_causal and not folded.is_causal and folded.mask is not None
    a, b = reference.forward(case.problem), reference.forward(folded.problem)
    assert np.array_equal(a.visible, b.visible) and np.array_equal(a.output, b.output)
    assert folded.causal_as_mask() is folded


@settings(max_examples=40, database=None, deadline=None)
@given(data=st.data())
def test_identity_values_make_the_output_the_weights(data):
    case = draw_case(data.draw, target("float64")).with_identity_values()
    d = case.dims
    assert case.v.shape == (d["B"], d["Hkv"], d["Lk"], d["Lk"])
    f = reference.forward(case.problem)
    assert np.array_equal(f.output, f.weights)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rounded_makes_a_hand_written_case_exact_in_the_dtype(dtype):
    q = np.array([[0.1, 1 / 3], [2.0**-20, -7.3]])  # (Lq, E)
    case = seed_case("hand-written", q, q[::-1], q * 3, mask=[[True, False], [True, True]], is_causal=True)
    r = case.rounded(dtype)
    for name in "qkv":
        x = getattr(r, name)
        assert x.shape == (1, 1, 2, 2) and exact_in(x, dtype)
        assert np.array_equal(x, np.asarray(round_to(getattr(case, name), dtype), dtype=np.float64))
    assert r.mask is case.mask and r.is_causal and r.label == "hand-written"
    if dtype == "float64":
        assert r is case
    else:
        assert not np.array_equal(r.q, case.q)  # 0.1 and 1/3 are not exact in it


# ---- literals: the reproducer's arrays ----------------------------------------------------------

def run_script(path, cwd, timeout=120) -> subprocess.CompletedProcess:
    """python path, in a fresh interpreter that imports only what the script sets up (no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, str(path)], cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=timeout)


ROUND_TRIP = {
    "specials": np.array([[0.0, -0.0, np.inf, -np.inf, np.nan],
                          [2.0**-1074, -2.0**-1074, 2.0**-1022 * (1 - 2.0**-52), 2.0**-1022, 1.7976931348623157e308]]),
    "shortest_repr": np.array([0.1, -1e-300, 1 / 3, 2 / 3, 1e22, 5e-324, 123456789.123456789]),
    "float32_values": np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32).astype(np.float64),
    "float32": np.array([[0.1, -0.0, np.inf], [1e-45, 3.4028235e38, -np.inf]], dtype=np.float32),
    "float16": np.array([65504.0, 2.0**-24, -0.0, 1 / 3], dtype=np.float16),
    "mask": np.array([[True, False, True], [False, False, True]]),
    "int64": np.array([[0, -1, 2**62, -2**63], [2**63 - 1, 7, -7, 1]], dtype=np.int64),
    "int32": np.array([3, -1, 2**31 - 1], dtype=np.int32),
    "four_d": np.arange(24.0).reshape(2, 1, 3, 4) / 7,  # (B, H, Lq, Lk)
    "scalar": np.array(-0.0),
}


def _round_trip(arrays: dict, tmp_path) -> dict:
    """Each literal written into a script, run in a fresh interpreter, its array saved: what it rebuilt."""
    out = tmp_path / "rebuilt.npz"
    body = "\n".join(f"{name} = {repro.literal(x)}" for name, x in arrays.items())
    script = tmp_path / "literals.py"
    script.write_text(f"import numpy as np\n{body}\nnp.savez({str(out)!r}, "
                      f"**{{n: np.asarray(x) for n, x in dict({', '.join(f'{n}={n}' for n in arrays)}).items()}})\n")
    proc = run_script(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    with np.load(out) as data:
        return {n: data[n] for n in data.files}


@pytest.mark.slow
def test_a_literal_rebuilds_the_array_bit_for_bit(tmp_path):
    """repro.literal: -0.0, +-inf, NaN, subnormals, float32 values, bools and int64 extremes come back
    with the same dtype, shape and bytes."""
    rebuilt = _round_trip(ROUND_TRIP, tmp_path)
    for name, x in ROUND_TRIP.items():
        y = rebuilt[name]
        assert (y.dtype, y.shape) == (x.dtype, x.shape), name
        assert y.tobytes() == x.tobytes(), name
    assert "np.nan" in repro.literal(ROUND_TRIP["specials"]) and "-np.inf" in repro.literal(ROUND_TRIP["specials"])


@pytest.mark.slow
def test_a_literal_keeps_the_shape_of_an_empty_array(tmp_path):
    """A problem with an empty size (test_empty_sizes: Lk = 0, so K is (1, 2, 0, 4)) must come back with
    its shape: nested empty lists alone lose every axis after the first zero."""
    arrays = {"k_empty": np.zeros((1, 2, 0, 4)), "q_empty": np.zeros((0, 2, 3, 4)), "ids": np.zeros((2, 0), np.int64)}
    rebuilt = _round_trip(arrays, tmp_path)
    for name, x in arrays.items():
        assert (rebuilt[name].dtype, rebuilt[name].shape) == (x.dtype, x.shape), (name, repro.literal(x))


# ---- reproducers: a planted failure, replayed in a fresh process ------------------------------

PLANTED = '''
"""numpy-naive that uses the first sequence's kv_lengths for the whole batch."""
import dataclasses

import numpy as np

from attnspec.backends.numpy_backends import NumpyNaive


class FirstSequenceLengths(NumpyNaive):
    name = "first-sequence-lengths"

    def native_attention(self, q, k, v, call):
        if call.kv_lengths is not None:
            first = np.full_like(call.kv_lengths, np.ravel(call.kv_lengths)[0])
            call = dataclasses.replace(call, kv_lengths=first)
        return super().native_attention(q, k, v, call)
'''
PLANTED_SPEC = "planted_first_lengths:FirstSequenceLengths"


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """The planted backend's float64 target, its module in a folder outside the checkout (imported
    afresh from there for each test)."""
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / "planted_first_lengths.py").write_text(textwrap.dedent(PLANTED))
    monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop("planted_first_lengths", None)
    t = {x.dtype: x for x in make_targets(PLANTED_SPEC)}["float64"]
    assert t.session.import_paths == (str(folder),)  # what the reproducer puts on sys.path
    yield t
    sys.modules.pop("planted_first_lengths", None)


def _problem(B, Lq, Lk, E, kv_lengths, seed=0, **extra) -> Case:
    rng = np.random.default_rng(seed)
    q, k, v = (np.round(rng.standard_normal((B, 1, L, E)) * 8) / 8 for L in (Lq, Lk, Lk))  # (B, H, L, E)
    return Case(q, k, v, fields=dict(kv_lengths=np.asarray(kv_lengths, dtype=np.int64), **extra))


def _fail(t, case) -> Counterexample:
    prop = repro.find_property("output", "matches_reference")
    with pytest.raises(Counterexample) as info:
        attempt(prop, t, case, {})
    return info.value


def _check_reproducer(path, failure, cwd):
    proc = run_script(path, cwd)
    lines = proc.stdout.splitlines()
    expected = verdict_lines(failure.verdict)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert lines[0] == ("matches_reference FAILED on backend 'first-sequence-lengths' at float64 "
                        "(the problem alone, in a fresh process)"), proc.stdout
    assert lines[1:1 + len(expected)] == expected, (proc.stdout, expected)
    assert lines[1 + len(expected)] == f"  problem: {failure.case!r}"


@pytest.mark.slow
def test_a_reproducer_prints_the_suites_verdict_in_a_fresh_process(planted, tmp_path):
    """A small problem: its arrays (a 2-D mask, a bias with -inf, int64 lengths) written as literals; the
    script, run by itself from another folder without PYTHONPATH, runs the property's own check and prints
    the suite's verdict lines, exit status 1.  The same problem passes on numpy-naive."""
    mask = np.array([[True, True, False], [True, False, True]])  # (Lq, Lk)
    bias = np.array([[0.0, -0.5, 0.25], [1.0, -np.inf, 0.0]])  # (Lq, Lk)
    case = _problem(2, 2, 3, 2, [3, 1], bias=bias).replace(mask=mask, scale=0.5)
    failure = _fail(planted, case)
    assert failure.verdict.name and not failure.verdict
    path, text = repro.write(str(tmp_path / "repro"), failure, headline(failure), planted.session.import_paths)
    assert os.path.basename(path) == "first-sequence-lengths-float64-matches_reference.py"
    assert not os.path.exists(path[:-3] + ".npz") and "np.load" not in text
    assert repro.literal(case.q) in text and repro.literal(bias) in text and repro.literal(mask) in text
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _check_reproducer(path, failure, elsewhere)
    out = io.StringIO()
    problem = dict(q=case.q, k=case.k, v=case.v, mask=mask, is_causal=False, scale=0.5, fields=case.fields, label="")
    assert repro.replay("numpy-naive", "float64", "output", "matches_reference", problem, {}, out=out) == 0
    assert "matches_reference PASSED on backend 'numpy-naive'" in out.getvalue()


@pytest.mark.slow
def test_a_large_problem_goes_to_an_npz_beside_the_script(planted, tmp_path):
    """Past repro.LITERAL_MAX entries the arrays go to an .npz (bit for bit) the script loads from its own
    folder; the script still prints the same verdict.  A later small reproducer of the same name removes
    the stale .npz."""
    failure = _fail(planted, _problem(2, 8, 12, 8, [12, 5], seed=1))
    assert sum(x.size for x in repro.arrays_of(failure).values()) > repro.LITERAL_MAX
    folder = tmp_path / "repro"
    path, text = repro.write(str(folder), failure, headline(failure), planted.session.import_paths)
    npz = path[:-3] + ".npz"
    assert os.path.exists(npz) and "np.load" in text and "np.array([" not in text
    with np.load(npz) as data:
        for name, x in repro.arrays_of(failure).items():
            assert data[name].dtype == x.dtype and data[name].tobytes() == x.tobytes(), name
    _check_reproducer(path, failure, tmp_path)
    small = _fail(planted, _problem(2, 2, 3, 2, [3, 1]))
    repro.write(str(folder), small, headline(small), planted.session.import_paths)
    assert not os.path.exists(npz)


# ---- running the suite --------------------------------------------------------------------------

def test_run_suite_refuses_no_backend():
    with pytest.raises(ValueError, match="backend_names"):
        run_suite([])


@pytest.mark.slow
def test_an_unknown_backend_is_a_suite_error_naming_it():
    """The run could not start: SuiteError with pytest's words, never an empty result that looks like a pass."""
    with pytest.raises(SuiteError, match=r"(?s)exit status 4.*unknown backend 'no-such-backend'"):
        run_suite(["no-such-backend"], timeout=120)


def test_ci_seed_follows_the_commit_unless_given(tmp_path):
    """ci draws change with the commit (issue 12: not the same draws forever), reproducibly."""
    from attnspec.properties import profiles

    assert profiles.ci_seed(str(tmp_path), {"ATTNSPEC_SEED": "17"}) == (17, "ATTNSPEC_SEED")
    with pytest.raises(ValueError, match="ATTNSPEC_SEED must be an integer; got 'x'"):
        profiles.ci_seed(str(tmp_path), {"ATTNSPEC_SEED": "x"})
    assert profiles.ci_seed(str(tmp_path), {}) == (0, "no git commit here")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    seeds = []
    for i in range(2):
        (tmp_path / "f").write_text(str(i))
        subprocess.run(git + ["add", "f"], cwd=tmp_path, check=True)
        subprocess.run(git + ["commit", "-q", "-m", str(i)], cwd=tmp_path, check=True)
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout
        seeds.append(profiles.ci_seed(str(tmp_path), {}))
        assert seeds[-1] == (int(head[:8], 16), f"commit {head[:8]}")
    assert seeds[0] != seeds[1]


def test_a_hang_is_learned_once_every_later_test_fails_at_once_naming_it(tmp_path):
    """`pytest properties --backend X` on a backend whose every call hangs: the first call waits the
    per-call limit, every later test fails at once naming the call and where it hung; only the test
    that hung writes a reproducer.  Before, each test waited the limit again (and its reproducer's
    check in a fresh process waited once more)."""
    import json

    limit = 2.0
    env = dict({k: v for k, v in os.environ.items() if not k.startswith(("ATTNSPEC_", "PYTEST_"))},
               PYTHONPATH=ROOT, ATTNSPEC_CALL_TIMEOUT=str(limit), ATTNSPEC_PROFILE="dev")
    proc = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "attnspec.properties", "-q", "-p",
                           "no:cacheprovider", "--backend", "tests.plugins.hanging:attention", "--attnspec-json",
                           "out.json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = json.loads((tmp_path / "out.json").read_text())["conformance"]
    checked = [r for r in rows if r["status"] != "skipped"]
    assert checked and all(r["status"] == "failed" for r in checked), {r["status"] for r in checked}
    first, *later = checked
    assert first["reproducer"] and os.path.exists(first["reproducer"]) and first["hung"]
    assert later and all(r["message"].startswith(f"not attempted: an earlier {first['hung']} call") and
                         f"in {first['property']}[{first['dtype']}] on the problem Case(" in r["message"]
                         and not r["reproducer"] for r in later), later[0]["message"]
    # one wait of the limit, maybe two (a probe and the first check); the rest costs nothing like a limit each
    assert sum(r["seconds"] for r in rows) < 2 * limit + 0.2 * len(rows), sum(r["seconds"] for r in rows)


def test_a_failing_propertys_report_shows_the_labelled_draws_of_its_shrunk_example():
    """draws.py's and variants.py's draw labels reach the failure block (not the headline a declaration's
    `when` reads): the shrunk example's own, Lq among them as the problem has it."""
    import re

    from attnspec.properties.explore import Exploration, explore
    from attnspec.properties.results import block
    from attnspec.properties.test_output import test_default_scale

    (target,) = [t for t in make_targets("tests.plugins.deviating:DeclaredAndAnotherDefect") if t.dtype == "float64"]
    failure = explore(test_default_scale.property, target, Exploration(examples=30, seed=0))
    assert failure is not None and failure.draws
    shown = block(failure, None)
    drawn = re.search(r"\n  drawn: (.*)\n", shown).group(1)
    assert re.search(r"\bLq=\d+", drawn) and "drawn:" not in headline(failure), shown
    lq = int(re.search(r"\bLq=(\d+)", repr(failure.case)).group(1))
    assert lq == 1 or lq >= 4, shown  # the planted defects: one-row queries, and four rows or more


def test_a_seeded_exploration_replays_from_its_seed_and_keeps_no_example_database(tmp_path):
    """Every exploration is seeded (the run's seed and the test's id): the same failure, shrunk the same,
    each time, and nothing written to the profile's example database (Hypothesis' seed() turns it off)."""
    from hypothesis import settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    from attnspec.properties.explore import Exploration, explore
    from attnspec.properties.test_output import test_default_scale

    (target,) = [t for t in make_targets("tests.plugins.deviating:DeclaredAndAnotherDefect") if t.dtype == "float64"]
    previous = settings.get_current_profile_name()
    settings.register_profile("attnspec-test-db", parent=settings.get_profile(previous),
                              database=DirectoryBasedExampleDatabase(str(tmp_path / "db")))
    settings.load_profile("attnspec-test-db")
    try:
        first, again = (explore(test_default_scale.property, target, Exploration(examples=30, seed=5))
                        for _ in range(2))
    finally:
        settings.load_profile(previous)
    assert first is not None and again is not None
    assert repr(first.case) == repr(again.case) and first.draws == again.draws
    assert not (tmp_path / "db").exists() or not any((tmp_path / "db").rglob("*"))


def test_a_property_that_checked_problems_is_never_skipped_as_all_declined():
    """A backend that answers its first calls and then declines every problem: the property passes on
    what it checked (not "every drawn problem was declined" after checking some); one that declines
    from the first call is skipped, and the reason counts declined and checked."""
    from _pytest.outcomes import Skipped

    from attnspec.properties.explore import Exploration, explore
    from attnspec.properties.test_weights import test_rows_sum_to_one

    (target,) = [t for t in make_targets("tests.plugins.declining:AnswersThenDeclines") if t.dtype == "float64"]
    prop = test_rows_sum_to_one.property
    tally: dict = {}
    try:
        found = explore(prop, target, Exploration(examples=40, seed=0), seeds=False, tally=tally)
    except Skipped as e:  # the old behaviour: 25 declines in a row skipped a property that had checked some
        pytest.fail(f"skipped after checking {tally.get('checked')} problem(s): {e}")
    assert found is None
    assert tally["checked"] >= 1, tally
    (never,) = [t for t in make_targets("tests.plugins.declining:AnswersThenDeclines") if t.dtype == "float64"]
    never.backend.calls = 10 ** 6  # declines from its first call
    with pytest.raises(Skipped, match=r"every drawn problem was declined \(\d+ declined, 0 checked\)"):
        explore(prop, never, Exploration(examples=40, seed=0), seeds=False)
