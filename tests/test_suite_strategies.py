"""The draws can fail: proportions of the problems `draws.draw_case` makes, per dtype and feature.

A property judged on a row where every visible score is the same (a near-uniform softmax), or
where the row sees one key (weight exactly 1), cannot see a temperature or scale bug; a 16-bit
draw that never saturates cannot see a max-subtraction bug; a feature never drawn is never
judged; a per-sequence field that is the same for every sequence of a batch cannot catch a kernel
that reads the first sequence's value for all.  These proportions are measured on a few hundred
draws made as the suite makes them (`explore`, seeded: Hypothesis' own engine) - or, where what
each draw chose matters, derandomized draws that keep their labelled choices - and held within
bounds.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from attnspec.backends.numpy_backends import NumpyNaive
from attnspec.backends.registry import resolve
from attnspec.properties import draws, variants
from attnspec.properties.distribution import cases
from attnspec.properties.draws import SCORE_CAP, draw_case
from attnspec.properties.explore import Exploration, Property, explore
from attnspec.properties.target import Target
from attnspec.properties.variants import DRAW_RATE, OPTIONAL, PER_SEQUENCE
from attnspec.specs import fields as F
from attnspec.specs import reference
from attnspec.specs.plain import round_to
from tests._helpers import target_of

N = 250
# a row is saturated when one key takes this much of the weight; bfloat16's scores stop at 8
# (SCORE_CAP: beyond it one rounding of a score moves a weight by more than the budget can
# tell from a bug), where a 0.99 share needs most of that range in one row
SATURATED = {"float16": 0.99, "bfloat16": 0.9, "float32": 0.99, "float64": 0.99}
# and how many draws must hold such a row: bfloat16's small element-wise draws (half of all)
# rarely reach a 0.9 share under its cap, the seeded ones mostly do
MIN_SATURATED = {"float16": 0.25, "bfloat16": 0.2, "float32": 0.25, "float64": 0.25}
FEATURES_LABEL = "optional features"  # the label of variants.chosen_features' one draw (a byte a feature)


def target(dtype: str, backend=None) -> Target:
    """A backend (numpy-naive: every optional feature) at any dtype; draws read only its capabilities
    and the dtype, and Ev != E is known to be taken, so no call is made."""
    return target_of(backend or resolve("numpy-naive"), dtype, equal_dims=False)


@contextlib.contextmanager
def no_database():
    """The current Hypothesis profile without its example database while the block runs."""
    previous = settings.get_current_profile_name()
    settings.register_profile("attnspec-tests-no-database", settings.get_profile(previous), database=None)
    settings.load_profile("attnspec-tests-no-database")
    try:
        yield
    finally:
        settings.load_profile(previous)


def suite_sample(t: Target, n: int, **constraints) -> list:
    """n problems drawn exactly as the suite draws them: `explore` runs a property that keeps its cases
    (seeded, so every run measures the same draws)."""
    got = []
    prop = Property("keeps_its_cases", "strategies_test", lambda target, case, params: got.append(case),
                    draw=cases(**constraints))
    with no_database():
        assert explore(prop, t, Exploration(examples=n, seed=0), seeds=False, shrink=False) is None
    assert len(got) >= n
    return got


def sample(t: Target, n: int, **constraints) -> list:
    """n derandomized draws with what each drew: [(case, {label: value drawn})]."""
    got = []

    @settings(max_examples=n, database=None, derandomize=True, deadline=None)
    @given(data=st.data())
    def run(data):
        drawn = {}

        def draw(strategy, label=None):
            drawn[label] = value = data.draw(strategy, label=label)
            return value

        got.append((draw_case(draw, t, **constraints), drawn))

    run()
    assert len(got) >= n
    return got


@functools.lru_cache(maxsize=None)
def every_feature_sample() -> tuple:
    """600 draws for numpy-naive at float32 (shared by the tests of the feature rates)."""
    return tuple(sample(target("float32"), 600))


def _stats(dtype: str) -> dict:
    rows = {"near_uniform": 0, "single_key": 0, "saturated": 0, "top_score_over_cap": 0}
    for case in suite_sample(target(dtype), N):
        f = reference.forward(case.problem)
        vis = f.visible  # (B, H, Lq, Lk)
        judged = vis.any(axis=-1)  # (B, H, Lq)
        if not judged.any():
            rows["single_key"] += 1
            continue
        s = np.where(vis, f.scores, np.nan)
        keys = vis.sum(axis=-1)  # (B, H, Lq)
        spread = np.nanmax(s, axis=-1) - np.nanmin(s, axis=-1)  # (B, H, Lq) on judged rows
        several = judged & (keys > 1)  # (B, H, Lq) rows where the softmax has a choice to make
        rows["near_uniform"] += bool(several.any() and np.all(spread[several] < 0.01))
        rows["single_key"] += bool(np.all(keys[judged] <= 1))
        rows["saturated"] += bool(np.any(f.weights.max(axis=-1)[several] > SATURATED[dtype]))
        rows["top_score_over_cap"] += bool(np.nanmax(np.abs(s)) > 1.5 * SCORE_CAP[dtype])
    return {k: v / N for k, v in rows.items()}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_draws_can_fail(dtype):
    """Drawn as the suite draws (explore).  Measured on 250 draws (seed 0): near-uniform draws in
    26 %, 26 %, 32 % and 24 % (float16, bfloat16, float32, float64), saturated 48 %, 30 %, 48 %,
    46 %: in 28-32 % of explore's examples q and k are all zeros (every score 0).  The same
    draw_case drawn inside one composite strategy (as the earlier machinery drew its cases) has
    q = k = 0 in 5 % of the examples and 4-5 % near-uniform draws."""
    p = _stats(dtype)
    print(dtype, p)
    assert p["near_uniform"] <= 0.20, p   # rows where a temperature bug is invisible
    assert p["single_key"] <= 0.15, p     # rows whose weight is exactly 1 whatever the kernel does
    assert p["saturated"] >= MIN_SATURATED[dtype], p  # rows deep in saturation: the max subtraction matters
    assert p["top_score_over_cap"] <= 0.05, p  # the cap keeps 16-bit budgets able to judge


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_byte_drawn_entries_are_exact_in_range_and_zero_bytes_spell_small_distinct_values(dtype):
    """Small arrays come from one byte string (draws.element_values): every entry exact in the dtype
    and in [-4, 4], every kind of entry reachable, and the zero bytes (where Hypothesis shrinks, and
    what its generation falls back on in many examples) small distinct values 0, 1, -1, 2, ... (in
    eighths in 16-bit formats) - never an array of zeros, whose scores would all be 0."""
    n = 4000
    width = n if dtype in draws.LOW_PRECISION else 4 * n
    values = draws.element_values(np.random.default_rng(1).bytes(width), n, dtype)
    assert np.array_equal(np.asarray(round_to(values, dtype), dtype=np.float64), values)
    assert values.min() >= -4 and values.max() <= 4 and values.min() < -3.5 and values.max() > 3.5
    zero = draws.element_values(bytes(width), n, dtype)  # (n,)
    unit = 1 / 8 if dtype in draws.LOW_PRECISION else 1.0
    assert list(zero[:5]) == [0.0, unit, -unit, 2 * unit, -2 * unit]
    shifted = draws.element_values(bytes(width), n, dtype, shift=3)
    assert shifted[0] == zero[3] and not np.array_equal(shifted[:4], zero[:4])  # q, k and v differ
    if dtype not in draws.LOW_PRECISION:  # ties, uniform values and powers of two far below 1
        assert np.mean(values == np.round(values)) > 0.3
        assert np.mean(values != np.round(values)) > 0.4
        assert np.any((values != 0) & (np.abs(values) < 2.0**-10))


# ---- the optional features ----------------------------------------------------------------------

def _feature_bytes(drawn: dict) -> bytes:
    found = [v for label, v in drawn.items() if label and label.startswith(FEATURES_LABEL)]
    assert len(found) == 1, f"no single draw labelled {FEATURES_LABEL!r}: {list(drawn)}"
    return found[0]


AS_BIAS_LABEL = "hidden keys as a -inf bias (0 = yes)"  # draws.as_bias: a drawn mask that became a -inf bias


def _drawn_features(case, drawn) -> frozenset:
    """The optional features the feature draw chose, as the case carries them: a bias that is a drawn
    mask made a -inf bias (draws.as_bias) is the mask kind's, not the feature draw's."""
    if drawn.get(AS_BIAS_LABEL) != 0:
        return case.features
    chosen_bias = any(b >= (1 - DRAW_RATE) * 256 for f, b in zip(OPTIONAL, _feature_bytes(drawn), strict=True) if f == "bias")
    return case.features - ({"bias"} - ({"bias"} if chosen_bias else set()))


def test_a_case_uses_exactly_the_features_its_draw_chose():
    """One byte a feature, 192 and up = used: the case carries exactly those features (grouped heads
    included) - none dropped on the way, none added - for a backend that takes them all."""
    assert OPTIONAL == tuple(dict.fromkeys(f.feature for f in F.FIELDS if f.drawn))  # the table's drawn rows
    assert set(OPTIONAL) <= resolve("numpy-naive").capabilities.features
    for case, drawn in every_feature_sample():
        raw = _feature_bytes(drawn)
        chosen = {f for f, b in zip(OPTIONAL, raw, strict=True) if b >= (1 - DRAW_RATE) * 256}
        assert _drawn_features(case, drawn) & set(OPTIONAL) == chosen, (raw, case)


def test_each_optional_feature_is_drawn_at_the_draw_rate():
    """Each optional feature (grouped heads included) is used at DRAW_RATE, independently, within 4
    binomial standard deviations.

    Counted over the distinct feature draws: Hypothesis' engine repeats a draw's choices in the
    examples it mutates from it (most of its examples share their feature bytes with another)
    and zero-extends early examples (the zero byte: no feature), so its examples are not
    independent draws.  Measured (600 derandomized examples): 97 distinct feature draws, rates
    gqa 0.24, bias 0.21, window 0.30, seq_lengths 0.30, segment_ids 0.19, softcap 0.26, alibi 0.24
    (4 sd: +-0.18; pooled 0.25 +-0.07).  Per example, repeats counted, the rates are 0.14-0.23:
    about a quarter of the examples draw the feature bytes all zero (no optional feature).
    """
    distinct = {_feature_bytes(drawn): _drawn_features(case, drawn) for case, drawn in every_feature_sample()}
    n = len(distinct)
    assert n >= 60, f"only {n} distinct feature draws in {len(every_feature_sample())} examples"
    sd = np.sqrt(DRAW_RATE * (1 - DRAW_RATE) / n)
    rates = {f: sum(f in features for features in distinct.values()) / n for f in OPTIONAL}
    print(n, rates)
    for f, rate in rates.items():
        assert abs(rate - DRAW_RATE) <= 4 * sd, (f, rate, 4 * sd, rates)
    pooled = np.mean(list(rates.values()))  # 7 n features: a tighter bound on the rate itself
    assert abs(pooled - DRAW_RATE) <= 4 * sd / np.sqrt(len(OPTIONAL)), (pooled, rates)
    for a, b in itertools.combinations(OPTIONAL, 2):  # independent: every pair is drawn together
        assert any({a, b} <= case.features for case, _ in every_feature_sample()), (a, b)


def _differs(case, names) -> bool:
    """Whether some sequence of the batch has another value than the first for one of the fields."""
    return any(not np.array_equal(case.fields[n][0], case.fields[n][b])
               for n in names if n in case.fields for b in range(1, case.dims["B"]))  # key lengths may come alone


def test_per_sequence_fields_are_drawn_on_a_batch_of_two_or_more():
    per_sequence = [c for c, _ in every_feature_sample() if PER_SEQUENCE & c.features]
    assert len(per_sequence) >= 100
    assert all(c.dims["B"] >= 2 for c in per_sequence)
    for c in per_sequence:
        for name in ("q_lengths", "kv_lengths", "q_segment_ids", "kv_segment_ids"):
            if name in c.fields:
                assert c.fields[name].shape[0] == c.dims["B"], (name, c)


@pytest.mark.parametrize("feature", sorted(PER_SEQUENCE))
def test_per_sequence_values_differ_across_the_batch_in_most_draws(feature):
    """A kernel that reads the first sequence's lengths or segment ids for the whole batch is caught
    only by a batch whose sequences differ: most draws that use the feature must have such a batch.

    The small problems (half of all) have Lq, Lk of 1-5: lengths of Lq, Lk <= 2 cannot differ (at
    least two rows or keys are kept; only the 1-in-16 length of 0 or 1 can), and below min(Lq, Lk) = 2
    there is one segment; Hypothesis' zero-extended examples give every sequence the same bytes.  The
    segment counts go in turn along the batch (variants.draw_segments): with one count for the whole
    batch, segment ids differed in 55 % of these draws under Hypothesis 6.170 (64 % under 6.155).
    The figures measured: docs/measurements.md."""
    names = F.FIELDS_OF[feature]
    cases = suite_sample(target("float32"), 300, need={feature})
    assert all(c.dims["B"] >= 2 for c in cases)
    share = np.mean([_differs(c, names) for c in cases])
    print(feature, share)
    assert share >= 0.6, f"{feature}: the sequences of a batch differ in {share:.0%} of the draws"


class NumpyCompiled(NumpyNaive):
    """numpy-naive flagged as compiling per shape: its draws come from the fixed menus (one shape a batch)."""

    name = "numpy-compiled"
    compiles_per_shape = True


def test_draws_keep_no_memoised_values():
    """The draws' strategies are Hypothesis' own or module constants; nothing drawn is kept: two cases
    of the same shape drawn in one example get lengths of their own, and drawing leaves the modules'
    state as it was.  Measured: the two cases' lengths differ in 86 of 100 examples (the rest drew
    the same bytes twice)."""
    def state(module) -> dict:
        return {name: (id(x), len(x) if isinstance(x, (dict, list, set)) else None) for name, x in vars(module).items()}

    for module in (draws, variants):
        for name, x in vars(module).items():
            assert not hasattr(x, "cache_info") and not hasattr(x, "cache_clear"), f"{module.__name__}.{name} caches"
    assert isinstance(draws.SEEDS, SearchStrategy)
    before = {m.__name__: state(m) for m in (draws, variants)}
    t = target("float32", NumpyCompiled())
    pairs = []

    @settings(max_examples=100, database=None, derandomize=True, deadline=None)
    @given(data=st.data())
    def run(data):
        a, b = (draw_case(data.draw, t, need={"seq_lengths"}, avoid={"gqa"}) for _ in range(2))
        assert a.q.shape == b.q.shape and a.k.shape == b.k.shape and a.q.shape[0] >= 2  # the batched menu's one
        pairs.append(not all(np.array_equal(a.fields.get(n), b.fields.get(n)) for n in ("q_lengths", "kv_lengths")))

    run()
    assert {m.__name__: state(m) for m in (draws, variants)} == before
    assert np.mean(pairs) > 0.5, np.mean(pairs)


# ---- compiling backends: a bounded set of static configurations ---------------------------------

def _check_covering(C, fields):
    """The compiled table's guarantees (variants.compiled_configs' docstring), for any fields."""
    n = len(C)
    assert n & (n - 1) == 0 and n >= 16  # 2^m rows
    assert all(not c.features - set(fields) for c in C)
    for f in fields:
        assert sum(f in c.features for c in C) == n // 2, f
        assert sum(c.grouped and f in c.features for c in C) == n // 8, f  # a test needing both has rows
        for i in range(4):  # every mask kind of four (and each scale) sees each field half the time
            assert sum(c.kind % 4 == i and f in c.features for c in C) == n // 8, (f, i)
    for a, b in itertools.combinations(fields, 2):  # a covering array of strength 2: all four combinations
        for want_a, want_b in itertools.product((True, False), repeat=2):
            assert sum((a in c.features) == want_a and (b in c.features) == want_b for c in C) == n // 4, (a, b)
    assert sum(c.grouped for c in C) == n // 4
    assert any(not c.features for c in C)


def test_the_compiled_configurations_cover_each_field_pair_kind_window_and_scale():
    """The fixed table a compiling backend's static choices come from (properties/variants.py), built
    as a covering array over the table's fields; grouping is the table's own column."""
    C = variants.COMPILED_CONFIGS
    fields = [f for f in OPTIONAL if f not in F.IN_SHAPE]
    _check_covering(C, fields)
    assert variants.compiled_configs() == C  # built, not drawn: the same every time
    assert sum(not c.features & {"bias", "window", "seq_lengths"} for c in C) >= 2  # jax-dpa's
    for n in (5, 4, 3, 2):  # any number of mask kinds a test allows
        assert min(collections.Counter(c.kind % n for c in C)[i] for i in range(n)) >= len(C) // n - 1
    assert min(collections.Counter(c.window % 3 for c in C)[i] for i in range(3)) >= len(C) // 3 - 1
    assert min(collections.Counter(c.scale % 2 for c in C)[i] for i in range(2)) == len(C) // 2
    for n in (5, 4):  # the shape menus: 5 shapes, 4 without the large one
        assert min(collections.Counter(c.shape % n for c in C)[i] for i in range(n)) >= len(C) // n - 1
    assert min(collections.Counter(c.shape % 2 for c in C if c.grouped)[i] for i in range(2)) >= 2  # 2 grouped


@pytest.mark.parametrize("count", [1, 2, 9, 14, 30])
def test_the_compiled_table_covers_every_pair_for_any_number_of_fields(count):
    """A new field needs no new seed: the construction covers any number of fields."""
    fields = tuple(f"field{i}" for i in range(count))
    _check_covering(variants.compiled_configs(fields), fields)


def _static(case) -> tuple:
    """What a compiling backend compiles a program for: shapes and the static arguments."""
    f = {k: v for k, v in case.fields.items() if k in ("window", "softcap", "causal_alignment", "enable_gqa")}
    present = tuple(sorted(k for k, v in case.fields.items() if isinstance(v, np.ndarray)))
    return (case.q.shape, case.k.shape, case.v.shape, None if case.mask is None else case.mask.shape, case.is_causal,
            case.scale, tuple(sorted(f.items())), present)


def test_a_compiling_backend_draws_a_bounded_set_of_static_configurations(monkeypatch):
    """jax-dpa's programs repeat from run to run: every static choice comes from one of the table's rows
    (with the shape menu's 7 shapes, at most rows x 7 configurations); drawn field by field (no row
    of the table fits), the same number of draws make far more.  Measured (300 draws each, through
    explore): 24 static configurations from the 16-row table, 83 field by field (22 and 87 with the
    earlier 24-row searched table)."""
    backend = resolve("jax-dpa")
    ok, why = backend.availability()
    if not ok:
        pytest.skip(f"jax-dpa unavailable: {why}")
    t = target("float32", backend)
    assert t.compiled
    seen, rows = {}, len(variants.COMPILED_CONFIGS)
    for table in (variants.COMPILED_CONFIGS, ()):  # () : no row fits, every field drawn on its own
        monkeypatch.setattr(variants, "COMPILED_CONFIGS", table)
        seen[bool(table)] = {_static(c) for c in suite_sample(t, 300)}
    menu = set(draws.COMPILED_SHAPES) | set(draws.COMPILED_GQA_SHAPES)
    assert {(s[0][0], s[0][1], s[1][1], s[0][2], s[1][2], s[0][3], s[2][3]) for s in seen[True]} <= menu
    assert len(seen[True]) <= rows * len(menu)
    print(len(seen[True]), len(seen[False]))
    assert len(seen[False]) > 2 * len(seen[True]), (len(seen[False]), len(seen[True]))
