"""The field table (specs/fields.py) is the single source: what a field's row says is what the
case transforms, the draws and the backends do with it - none of them names a field."""
from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

from attnspec.properties import variants
from attnspec.properties.case import Case
from attnspec.specs import fields as F

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _case(**fields) -> Case:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 1, L, 3)) for L in (4, 5, 5))  # (B, H, L, E)
    return Case(q, k, v, fields=fields)


@pytest.mark.parametrize("side", ["query", "key"])
def test_permuting_moves_every_field_with_an_axis_on_that_side(side):
    """Each field whose row has an axis on the permuted side moves along it; the others stay."""
    L = 4 if side == "query" else 5
    perm = list(range(L))[::-1]
    values = {"bias": np.arange(2 * 4 * 5, dtype=float).reshape(2, 1, 4, 5),
              "q_segment_ids": np.arange(8).reshape(2, 4) % 2, "kv_segment_ids": np.arange(10).reshape(2, 5) % 2}
    case = _case(**values)
    moved = case.permuted("q" if side == "query" else "k", perm)
    for name, x in values.items():
        axis = F.BY_NAME[name].axis_of(side)
        want = x if axis is None else np.take(x, perm, axis=axis)
        assert np.array_equal(moved.fields[name], want), name
    cut = case.keys(1, 3)
    for name, x in values.items():
        axis = F.BY_NAME[name].axis_of("key")
        want = x if axis is None else np.take(x, [1, 2], axis=axis)
        assert np.array_equal(cut.fields[name], want), name


def test_the_rows_say_what_the_derived_sets_hold():
    assert F.POSITIONAL == {f.feature for f in F.FIELDS if f.positional}
    assert F.DIAGONAL <= F.POSITIONAL
    assert F.EVERY_FEATURE | F.SERVING_FEATURES == set(F.FEATURES) and not F.EVERY_FEATURE & F.SERVING_FEATURES
    assert variants.OPTIONAL == F.DRAWN and "causal_bottom_right" not in F.DRAWN  # drawn with the diagonal
    assert variants.PER_SEQUENCE == {f.feature for f in F.FIELDS if f.per_sequence}
    for f in F.FIELDS:
        assert f.is_off(f.off) and F.is_off(f.name, f.off)
        assert not f.is_off(np.zeros(1))  # an array is never off


def test_a_problem_on_the_diagonal_reads_the_table():
    from attnspec.specs.problem import validate
    q = np.zeros((1, 1, 2, 2))
    k = np.zeros((1, 1, 3, 2))
    assert not F.on_diagonal(validate(q, k, k))
    assert F.on_diagonal(validate(q, k, k, is_causal=True))
    assert F.on_diagonal(validate(q, k, k, window=(1, 0)))
    assert F.on_diagonal(validate(q, k, k, alibi_slopes=np.ones(1)))
    assert not F.on_diagonal(validate(q, k, k, softcap=2.0))


@pytest.mark.parametrize("path, start, end", [
    ("properties/case.py", "def replace(", "# ---- what it is"),
    ("properties/case.py", "def _along(", "def rounded("),
    ("properties/variants.py", "def _codes(", "COMPILED_CONFIGS = compiled_configs()")])
def test_the_case_transforms_and_the_compiled_table_name_no_field(path, start, end):
    """Adding a field must not touch case.py's replace, permutation and cut, or the compiled-config
    table: none of them names a field (grouped heads' own transforms, and each field's draw below
    the table, do)."""
    text = (ROOT / path).read_text()
    text = text[text.index(start):text.index(end)]
    names = [n for n in F.NAMES + tuple(F.FEATURES) if re.search(rf'"{n}"', text)]
    assert not names, f"{path} names fields {names}"
