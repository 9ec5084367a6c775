"""The seeds' printed numbers: parsed faithfully, all checked, errata decided by computation."""
import dataclasses
import math
import pathlib

import numpy as np
import pytest

from attnspec.specs import problem, reference
from attnspec.specs import worked_examples as W
from attnspec.specs.worked_examples_data import SOURCES

SEEDS = pathlib.Path(__file__).resolve().parents[2] / "shared" / "seeds"


@pytest.fixture(scope="module")
def rows():
    return W.check()


def test_every_example_is_checked_once(rows):
    assert len(rows) == len(W.EXAMPLES) > 300
    keys = [(e.source, e.quantity) for e in W.EXAMPLES]
    assert len(set(keys)) == len(keys), "a quantity is listed twice"
    assert [(r.source, r.quantity) for r in rows] == keys
    assert {e.source for e in W.EXAMPLES} == set(SOURCES.values())


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"seed files not found at {SEEDS}")
def test_printed_text_is_verbatim_from_its_seed():
    texts = {name: (SEEDS / name).read_text(encoding="utf-8") for name in SOURCES.values()}
    missing = [(e.source, e.quantity, e.printed) for e in W.EXAMPLES if e.printed not in texts[e.source]]
    assert not missing


@pytest.mark.parametrize("text,value,decimals", [
    ("0,707", 0.707, 3), ("−0,67", -0.67, 2), ("~1,4", 1.4, 1), ("~23", 23, 0), ("~270", 270, -1),
    ("±8", 8, 0), ("8e-06", 8e-6, 6), ("268M", 268e6, -6), ("- 0.0511", -0.0511, 4), ("0.0", 0.0, 1),
    ("−∞", -math.inf, 0), ("-inf", -math.inf, 0), ("50/50", 0.5, 1), ("2", 2.0, 0),
])
def test_parse(text, value, decimals):
    v, d, half = W.parse(text)
    assert v == value and d == decimals
    assert half == (0.0 if math.isinf(v) else (0.05 if text == "50/50" else 0.5 * 10.0**-d))


def test_parse_rejects_what_it_cannot_read():
    with pytest.raises(ValueError, match="not understood"):
        W.parse("about three")


def test_agreement_is_exactly_the_tolerance_rule(rows):
    for r in rows:
        assert r.tolerance >= 0.5 * 10.0**-r.decimals or math.isinf(r.value)
        if "visible_entries" in r.quantity:
            continue  # bounds: judged one-sided
        if math.isinf(r.value) or math.isinf(r.computed):
            assert r.agrees == (r.value == r.computed)
        else:
            assert r.agrees == (abs(r.value - r.computed) <= r.tolerance), r


def test_errata_carry_both_values_and_a_note(rows):
    errata = [r for r in rows if not r.agrees]
    for r in errata:
        assert r.printed and np.isfinite(r.computed) and "ERRATUM" in r.note and r.printed in r.note
    for r in rows:
        if r.agrees:
            assert "ERRATUM" not in r.note


def test_moving_a_printed_number_past_its_tolerance_makes_an_erratum(monkeypatch, rows):
    """The judgement is not rigged: agreeing values shifted just past their tolerance fail."""
    agreeing = {(r.source, r.quantity): r for r in rows if r.agrees}
    picked = ("example.weights", "example.output[", "json.", "row2.softmax", "Y[2][", "typical_dot")
    moved, examples = set(), []
    for e in W.EXAMPLES:
        r = agreeing.get((e.source, e.quantity))
        if r is not None and e.quantity.startswith(picked):
            e = dataclasses.replace(e, value=r.computed + 1.01 * r.tolerance)
            moved.add((e.source, e.quantity))
        examples.append(e)
    assert len(moved) > 40
    monkeypatch.setattr(W, "EXAMPLES", examples)
    for r in W.check():
        if (r.source, r.quantity) in moved:
            assert not r.agrees, r


def test_seed_problems_are_valid_and_exact():
    for name, p in W.SEED_PROBLEMS.items():
        assert set(p) == {"q", "k", "v", "mask", "is_causal", "scale"}, name
        problem.validate(p["q"], p["k"], p["v"], p["mask"], p["is_causal"], p["scale"])
    for case in ("d=8_unscaled", "d=8_scaled", "d=256_unscaled", "d=256_scaled"):
        p = W.SEED_PROBLEMS[f"004_{case}"]
        fw = W.run(p)
        assert np.array_equal(fw.scores, p["q"])  # q . e_j is the score, exactly
        assert np.array_equal(fw.output, fw.weights)  # V = I: the output is the weights


def test_seed_000_example_by_hand():
    p = W.SEED_PROBLEMS["000_example"]
    s = np.array([1.0, 0.0, 0.9]) / math.sqrt(2)
    w = np.exp(s) / np.exp(s).sum()
    np.testing.assert_allclose(W.run(p).output[0], w @ p["v"], rtol=1e-14)
    fw = W.run(W.SEED_PROBLEMS["000_exercise"])
    assert np.argmax(fw.weights[0]) == 1  # the exercise: the largest weight goes to key 1
    assert np.array_equal(W.run(W.SEED_PROBLEMS["000_exercise_causal"]).weights[0], [1.0, 0.0, 0.0])


def test_seed_003_problem_is_q_k_half_x():
    p = W.SEED_PROBLEMS["003_causal"]
    assert np.array_equal(p["q"], p["k"]) and np.array_equal(p["q"] * 2, p["v"])
    fw = reference.forward(p["q"], p["k"], p["v"], is_causal=True)
    np.testing.assert_allclose(fw.scores, p["v"] @ p["v"].T / 8)  # 0.25 X X^T / sqrt(4)


def test_errata_helper_matches_check(rows):
    assert [(r.source, r.quantity) for r in W.errata()] == [(r.source, r.quantity) for r in rows if not r.agrees]
