"""The draws can fail: proportions of the problems the strategies make, per dtype.

A property judged on a row where every visible score is the same (a near-uniform softmax), or
where the row sees one key (weight exactly 1), cannot see a temperature or scale bug; a
16-bit draw that never saturates cannot see a max-subtraction bug.  These proportions are
measured on a few hundred derandomized draws and held within bounds.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnspec.backends.base import Capabilities
from attnspec.properties.strategies import SCORE_CAP, cases
from attnspec.specs import reference

_CAPS = Capabilities(dtypes=("float16", "bfloat16", "float32", "float64"),
                     features=frozenset(("gqa", "bias", "window", "seq_lengths", "segment_ids", "softcap", "alibi")))
N = 250
# a row is saturated when one key takes this much of the weight; bfloat16's scores stop at 8
# (SCORE_CAP: beyond it one rounding of a score moves a weight by more than the budget can
# tell from a bug), where a 0.99 share needs most of that range in one row
SATURATED = {"float16": 0.99, "bfloat16": 0.9, "float32": 0.99, "float64": 0.99}
# and how many draws must hold such a row: bfloat16's small element-wise draws (half of all)
# rarely reach a 0.9 share under its cap, the seeded ones mostly do
MIN_SATURATED = {"float16": 0.25, "bfloat16": 0.2, "float32": 0.25, "float64": 0.25}


def _stats(dtype: str) -> dict:
    rows = {"near_uniform": 0, "single_key": 0, "saturated": 0, "top_score_over_cap": 0}

    @settings(max_examples=N, database=None, derandomize=True, deadline=None)
    @given(data=st.data())
    def sample(data):
        case = data.draw(cases(dtype, _CAPS))
        f = reference.forward(case.problem)
        vis = f.visible  # (B, H, Lq, Lk)
        judged = vis.any(axis=-1)  # (B, H, Lq)
        if not judged.any():
            rows["single_key"] += 1
            return
        s = np.where(vis, f.scores, np.nan)
        keys = vis.sum(axis=-1)  # (B, H, Lq)
        spread = np.nanmax(s, axis=-1) - np.nanmin(s, axis=-1)  # (B, H, Lq) on judged rows
        several = judged & (keys > 1)  # (B, H, Lq) rows where the softmax has a choice to make
        rows["near_uniform"] += bool(several.any() and np.all(spread[several] < 0.01))
        rows["single_key"] += bool(np.all(keys[judged] <= 1))
        rows["saturated"] += bool(np.any(f.weights.max(axis=-1)[several] > SATURATED[dtype]))
        rows["top_score_over_cap"] += bool(np.nanmax(np.abs(s)) > 1.5 * SCORE_CAP[dtype])

    sample()
    return {k: v / N for k, v in rows.items()}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_draws_can_fail(dtype):
    p = _stats(dtype)
    print(dtype, p)
    assert p["near_uniform"] <= 0.20, p   # rows where a temperature bug is invisible
    assert p["single_key"] <= 0.15, p     # rows whose weight is exactly 1 whatever the kernel does
    assert p["saturated"] >= MIN_SATURATED[dtype], p  # rows deep in saturation: the max subtraction matters
    assert p["top_score_over_cap"] <= 0.05, p  # the cap keeps 16-bit budgets able to judge


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_byte_drawn_entries_are_exact_in_range_and_shrink_to_zero(dtype):
    """Small arrays come from one byte string (properties.strategies._element_values): every
    entry exact in the dtype and in [-4, 4], every kind of entry reachable, and the zero bytes
    (where Hypothesis shrinks) the value 0."""
    from attnspec.properties.strategies import LOW_PRECISION, _element_values
    from attnspec.specs.error_budget import round_to

    n = 4000
    width = n if dtype in LOW_PRECISION else 4 * n
    values = _element_values(np.random.default_rng(1).bytes(width), n, dtype)
    assert np.array_equal(np.asarray(round_to(values, dtype), dtype=np.float64), values)
    assert values.min() >= -4 and values.max() <= 4 and values.min() < -3.5 and values.max() > 3.5
    assert np.all(_element_values(bytes(width), n, dtype) == 0)
    if dtype not in LOW_PRECISION:  # ties, uniform values and powers of two far below 1
        assert np.mean(values == np.round(values)) > 0.3
        assert np.mean(values != np.round(values)) > 0.4
        assert np.any((values != 0) & (np.abs(values) < 2.0**-10))


def test_strategy_objects_are_reused_for_the_same_arguments_and_built_afresh_for_unhashable_ones():
    """properties/reuse.py: Hypothesis validates each new strategy object (~0.1 ms); the same
    arguments share one, so a draw builds almost none."""
    from attnspec.properties.reuse import reused, sampled

    made = []

    @reused
    def menu(*choices, **kw):
        made.append(choices)
        return st.sampled_from(choices)

    assert menu(1, 2) is menu(1, 2) and menu(1, 2) is not menu(2, 1) and len(made) == 2
    assert menu([1], key=[2]) is not menu([1], key=[2]) and len(made) == 4  # unhashable: built each time
    assert sampled((0.5, None)) is sampled((0.5, None))
    caps = Capabilities(dtypes=("float32",), masks=True, causal=True)
    assert cases("float32", caps) is cases("float32", caps)  # a frozen Capabilities is a key


def test_the_compiled_configurations_cover_each_field_pair_kind_window_and_scale():
    """The fixed table a compiling backend's static choices come from (properties/variants.py)."""
    import collections
    import itertools

    from attnspec.properties.variants import COMPILED_CONFIGS, OPTIONAL

    assert len(COMPILED_CONFIGS) == 24
    for f in OPTIONAL:
        assert 9 <= sum(f in c.features for c in COMPILED_CONFIGS) <= 15, f
    for a, b in itertools.combinations(OPTIONAL, 2):
        assert sum({a, b} <= c.features for c in COMPILED_CONFIGS) >= 3, (a, b)
    assert any(not c.features for c in COMPILED_CONFIGS)
    assert sum(not c.features & {"bias", "window", "seq_lengths"} for c in COMPILED_CONFIGS) >= 3  # jax-dpa's
    for n, least in ((5, 3), (4, 4), (3, 6), (2, 10)):  # any number of mask kinds a test allows
        assert min(collections.Counter(c.kind % n for c in COMPILED_CONFIGS)[i] for i in range(n)) >= least
    assert min(collections.Counter(c.window % 3 for c in COMPILED_CONFIGS)[i] for i in range(3)) >= 6
    assert min(collections.Counter(c.scale % 2 for c in COMPILED_CONFIGS)[i] for i in range(2)) >= 10
    for n in (5, 4, 2):  # the shape menus: 5 shapes, 4 without the large one, 2 grouped
        assert min(collections.Counter(c.shape % n for c in COMPILED_CONFIGS)[i] for i in range(n)) >= 3
    assert 4 <= sum(c.grouped for c in COMPILED_CONFIGS) <= 12


def test_a_compiling_backend_draws_a_bounded_set_of_static_configurations(monkeypatch):
    """Its programs repeat from run to run: every static choice comes from one of the 24 rows
    (with the shape menu's 7 shapes, at most 24 x 7 configurations); drawn field by field, the
    same number of draws make far more (and more with every run)."""
    from attnspec.properties import variants
    from attnspec.properties.strategies import COMPILED_GQA_SHAPES, COMPILED_SHAPES

    def static(case) -> tuple:
        f = {k: v for k, v in case.fields.items() if k in ("window", "softcap", "causal_alignment", "enable_gqa")}
        present = tuple(sorted(k for k, v in case.fields.items() if isinstance(v, np.ndarray)))
        return (case.q.shape, case.k.shape, case.mask is None, case.is_causal, case.scale,
                tuple(sorted(f.items())), present)

    seen = {}
    for table in (variants.COMPILED_CONFIGS, ()):  # () : no row fits, every field drawn on its own
        monkeypatch.setattr(variants, "COMPILED_CONFIGS", table)
        seen[bool(table)] = set()

        @settings(max_examples=600, database=None, derandomize=True, deadline=None)
        @given(data=st.data())
        def sample(data):
            seen[bool(table)].add(static(data.draw(cases("float32", _CAPS, compiled=True))))

        sample()
    assert len(seen[True]) <= 24 * (len(COMPILED_SHAPES) + len(COMPILED_GQA_SHAPES))
    assert len(seen[False]) > 2 * len(seen[True])
