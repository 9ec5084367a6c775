"""Declared limits (Capabilities, or `declare(...)` for a plain function): the draws and the fixed
grids honour them by construction, a problem outside them is declined naming the limit, and a grid
that a limit cut says how much it left out."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnspec.backends.base import Capabilities, Unsupported
from attnspec.backends.plain import FunctionBackend, declare
from attnspec.properties import test_edges as edges  # a module: pytest collects no property here
from attnspec.properties.draws import draw_case
from attnspec.properties.judge import agreement
from attnspec.properties.target import Target
from attnspec.specs import reference
from tests._helpers import target_of

LIMITS = dict(max_head_dim=32, head_dim_power_of_two=True, length_multiple=4, max_length=128,
              causal_equal_lengths=True)


def _kernel(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """The reference, refusing loudly what its declaration excludes (a kernel without the base's check)."""
    E, Ev, Lq, Lk = query.shape[-1], value.shape[-1], query.shape[-2], key.shape[-2]
    assert not Capabilities(**LIMITS).outside(E, Ev, Lq, Lk, is_causal), (E, Ev, Lq, Lk, is_causal)
    return reference.attention(query, key, value, attn_mask, is_causal, scale).astype(query.dtype)


def _target(**limits) -> Target:
    fn = declare(**(limits or LIMITS))(_kernel)
    return target_of(FunctionBackend(fn, "limited"), "float32", equal_dims=False)


@pytest.mark.parametrize("probe", [False, True])
def test_draws_honour_every_declared_limit(probe):
    """Head dims powers of two up to 32, lengths multiples of 4 up to 128, causal only with Lq = Lk:
    every drawn problem is inside, and the kernel agrees with the reference on each (none declined)."""
    t = _target()
    seen = []

    @settings(max_examples=60, database=None, derandomize=True, deadline=None)
    @given(data=st.data())
    def run(data):
        case = draw_case(data.draw, t, probe=probe)
        d = case.dims
        seen.append(d)
        assert not t.caps.outside(d["E"], d["Lk"] if probe else d["Ev"], d["Lq"], d["Lk"], case.is_causal), d
        agreement(t, case.with_identity_values() if probe else case)

    run()
    assert any(d["E"] > 4 for d in seen) and any(d["Lk"] > 8 for d in seen)  # not only the smallest sizes


def test_a_problem_outside_the_limits_is_declined_naming_them():
    q = np.zeros((1, 1, 4, 48))  # E = 48: > 32 and not a power of two
    with pytest.raises(Unsupported, match=r"outside the declared limits \(E=48 > 32; E=48 not a power of two\)"):
        _target().backend.forward(q, q, q, dtype="float32")
    k = np.zeros((1, 1, 8, 8))
    with pytest.raises(Unsupported, match=r"causal with Lq=4 != Lk=8"):
        _target().backend.forward(np.zeros((1, 1, 4, 8)), k, k, is_causal=True, dtype="float32")


def test_dtypes_per_op_narrow_the_backward():
    caps = Capabilities(dtypes=("float64", "float32"), gradients=True, op_dtypes=(("forward_backward", ("float64",)),))
    assert caps.dtypes_for("forward") == ("float64", "float32") and caps.dtypes_for("forward_backward") == ("float64",)


def _past_128(alignments=("top_left",)) -> tuple:
    """The edge grid's rows a kernel with no optional field and these alignments runs, and how many of
    them have a head dim past 128 (each with E past it: counted once, under E)."""
    applicable = [row for row in edges.grid() if not row.needs() and row.alignment in (None, *alignments)]
    past = [row for row in applicable if max(row.E, row.value_dim) > 128]
    assert past and all(row.E > 128 for row in past)
    return applicable, len(past)


def test_the_edge_grid_leaves_out_what_the_limits_exclude_and_says_how_much():
    """E > 128 leaves the head dims 160, 192, 256 and 512 out (and E = 192 beside Ev = 128): not run (so never
    passed), counted by limit.  The window, key-padding and grouped-heads rows need a window, a bias and
    grouped heads, and a row asking an alignment needs it taken, which this kernel does not: not
    applicable, not counted."""
    t = _target(max_head_dim=128)
    problems = edges.grid_problems(t)
    applicable, n = _past_128(t.alignments)  # this kernel takes no optional field, top-left causal only
    assert {f for row in edges.grid() for f in row.needs()} >= {"window", "bias", "gqa"}
    assert len(applicable) < len(edges.grid())
    assert len(problems) == len(applicable) - n
    assert all(c.dims["E"] <= 128 for c, _ in problems)
    assert t.coverage()["outside_limits"] == f"{n} outside the declared limits (E > 128: {n})"
    unlimited = _target(max_head_dim=0)
    assert len(edges.grid_problems(unlimited)) == len(applicable) and "outside_limits" not in unlimited.coverage()


@pytest.mark.parametrize("bad", [dict(max_head_dim=-1), dict(length_multiple=0), dict(head_dims=(0,)),
                                 dict(op_dtypes={"backward": ("float32",)}),
                                 dict(head_dims=(48,), head_dim_power_of_two=True)])
def test_declare_refuses_bad_limits_by_name(bad):
    with pytest.raises(ValueError, match="declare: "):
        declare(**bad)(_kernel)


def test_fitting_moves_a_size_to_the_nearest_one_taken():
    caps = Capabilities(max_head_dim=128, head_dim_power_of_two=True)
    assert [caps.fit_head_dim(E) for E in (3, 72, 128, 160, 256)] == [4, 128, 128, 128, 128]
    assert Capabilities(head_dims=(64, 96)).fit_head_dim(8) == 64
    assert Capabilities(length_multiple=16, max_length=40).fit_length(33) == 32


@pytest.mark.slow
def test_a_grid_a_limit_cut_says_so_in_the_summary_and_the_json(tmp_path):
    """`pytest properties --backend X` on a kernel declaring E <= 128: the edge grid passes on what it ran,
    and the terminal summary and the JSON row say how many grid problems the limit left out (never a
    plain "passed, 73 problems")."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict({k: v for k, v in os.environ.items() if not k.startswith(("ATTNSPEC_", "PYTEST_"))},
               PYTHONPATH=root, ATTNSPEC_PROFILE="dev")
    proc = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "attnspec.properties", "-q", "-p",
                           "no:cacheprovider", "--backend", "tests.plugins.limited:attention", "-k", "edge_shapes",
                           "--attnspec-json", "out.json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (row,) = [r for r in json.loads((tmp_path / "out.json").read_text())["conformance"] if r["status"] != "skipped"]
    _, n = _past_128()
    assert row["status"] == "passed" and row["outside_limits"] == f"{n} outside the declared limits (E > 128: {n})", row
    assert "checks narrowed by declared limits" in proc.stdout
    assert "edge_shapes_match_reference[float32]: passed" in proc.stdout and f"E > 128: {n}" in proc.stdout, proc.stdout
