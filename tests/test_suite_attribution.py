"""Failure attribution: a failure is reported with the optional features it needs.

A plain function with PyTorch's full signature (so it takes grouped KV heads and float masks) whose
grouped-heads path raises: every property that draws grouped heads now and then fails, and each
failure says it "fails only with grouped KV heads (enable_gqa)" - the counterexample passes
without them, and fresh draws without them pass too - in its block, in the terminal's "what the
failures need" section and in its JSON row; properties that never draw grouped heads (the edge
grid, the semantics questions) pass.
"""
from __future__ import annotations

import os
import re

import pytest

from attnspec.properties.runner import run_suite

pytestmark = pytest.mark.slow  # starts a python/pytest process: the fast loop (-m "not slow") leaves the module out

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKEND = "tests.plugins.planted:gqa_raises"
ONLY = "test_matches_reference or rows_sum_to_one or edge_shapes or test_semantics.py or grouped_heads_match"
EXAMPLES = 20
NEEDS_GQA = f"fails only with grouped KV heads (enable_gqa): {EXAMPLES} draws without it passed"


def _run(tmp_path, *extra):
    return run_suite([BACKEND], json_path=str(tmp_path / "out.json"), profile="dev", cwd=str(tmp_path),
                     pythonpath=[ROOT], timeout=600,
                     extra_args=["-k", ONLY, "--hypothesis-seed=0", f"--attnspec-examples={EXAMPLES}", *extra])


def test_a_failure_that_needs_grouped_heads_says_so_per_property(tmp_path):
    result = _run(tmp_path)
    rows = {r["property"]: r for r in result.conformance}
    failed = {p for p, r in rows.items() if r["status"] == "failed"}
    assert failed == {"matches_reference", "rows_sum_to_one", "grouped_heads_match_repeated_kv",
                      "edge_shapes_match_reference"}, result.output[-4000:]
    for prop in ("matches_reference", "rows_sum_to_one"):
        assert rows[prop]["attribution"] == NEEDS_GQA, rows[prop]
        assert "raised RuntimeError: grouped path not built" in rows[prop]["message"]
        assert f"\n  attribution: {NEEDS_GQA}" in rows[prop]["message"]  # in its block too
    # a property that requires grouped heads draws them every time: nothing to attribute
    assert rows["grouped_heads_match_repeated_kv"]["attribution"] == ""
    # the edge grid has grouped-heads rows (split-KV paths): a fixed problem, nothing drawn to attribute
    assert "grouped path not built" in rows["edge_shapes_match_reference"]["message"]
    assert rows["edge_shapes_match_reference"]["attribution"] == ""
    # the semantics questions never draw grouped heads: they pass (or are recorded)
    semantics = {p: r["status"] for p, r in rows.items() if p not in failed}
    assert semantics and set(semantics.values()) <= {"passed", "recorded", "skipped"}, semantics
    assert {"fully_masked_rows", "causal_alignment", "empty_sizes", "output_dtype"} <= {
        p for p, s in semantics.items() if s == "passed"}
    # the terminal: one line for the backend and what its failures need, naming the properties
    section = result.output.split(" attnspec: what the failures need ")[1].split("\n", 1)[1].split("\n=")[0]
    (line,) = [x for x in section.splitlines() if x.strip()]
    assert line.startswith(f"{BACKEND}: 2 properties {NEEDS_GQA} - "), line
    assert sorted(re.findall(r"(\w+)\[float64\]", line.split(" - ", 1)[1])) == ["matches_reference", "rows_sum_to_one"]
    assert result.returncode == 1


def test_unshrunk_failures_are_not_attributed(tmp_path):
    result = _run(tmp_path, "--attnspec-no-shrink")
    failed = [r for r in result.conformance if r["status"] == "failed"]
    assert {r["property"] for r in failed} >= {"matches_reference", "rows_sum_to_one"}, result.output[-3000:]
    assert all(r["attribution"] == "" for r in failed)
    assert "what the failures need" not in result.output and "attribution:" not in result.output
