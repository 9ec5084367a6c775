"""The suite's own machinery: reproducers run, inputs are exact, bad input is refused by name.

These are the harness's self-tests: they live in tests/, never in the user's `pytest properties`
(a conformance verdict must never depend on them)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnspec.backends.base import Capabilities
from attnspec.backends.registry import resolve
from attnspec.specs.error_budget import round_to

from attnspec.properties.judge import snippet
from attnspec.properties.runner import run_suite
from attnspec.properties.strategies import Case, cases, literal, run
from attnspec.properties.targets import Target

_CAPS = Capabilities(dtypes=("float16", "bfloat16", "float32", "float64"),
                     features=frozenset(("gqa", "bias", "window", "seq_lengths", "segment_ids", "softcap", "alibi")))
_SMALLEST_NORMAL = {"float16": 2.0**-14, "bfloat16": 2.0**-126, "float32": 2.0**-126, "float64": 2.0**-1022}


@settings(max_examples=60, database=None)
@given(dtype=st.sampled_from(_CAPS.dtypes), data=st.data())
def test_case_code_rebuilds_exact_inputs(dtype, data):
    """The printed statements rebuild the very arrays run, and every input is a normal number of dtype."""
    case = data.draw(cases(dtype, _CAPS), label="problem")
    env = {"np": np}
    exec("\n".join(case.code), env)  # noqa: S102
    for name in ("q", "k", "v"):
        x = env[name]
        assert np.array_equal(x, getattr(case, name)), name
        assert np.array_equal(np.asarray(round_to(x, dtype), dtype=np.float64), x), name
        nonzero = np.abs(x[x != 0])
        assert nonzero.size == 0 or nonzero.min() >= _SMALLEST_NORMAL[dtype], f"{name} has a subnormal {nonzero.min()}"
    assert (env["mask"] is None) == (case.mask is None)
    assert env["fields"].keys() == case.fields.keys()


def test_reproducer_runs_and_matches():
    """A failure's snippet is runnable as printed and makes the same call."""
    target = Target(resolve("numpy-naive"), "float32")
    target.spec = "numpy-naive"
    q = np.arange(6.0).reshape(1, 1, 2, 3) / 4  # (B, H, Lq, E)
    case = Case(q, q, q, None, True, 0.5, (literal("q", q), "k = q.copy()", "v = q.copy()", "mask = None",
                                           "fields = {}"))
    env: dict = {}
    exec(snippet(target, case, checks=("err = np.abs(out - expected.output).max()",)), env)  # noqa: S102
    assert env["err"] < 1e-6
    assert np.array_equal(env["out"], target.backend.forward(q, q, q, None, True, 0.5, "float32"))


def test_literal_round_trips_floats_exactly():
    x = np.array([[0.1, -1e-300, 1 / 3, 2.0**-1074]])  # (1, 4) shortest repr round-trips
    env = {"np": np}
    exec(literal("x", x), env)  # noqa: S102
    assert np.array_equal(env["x"], x)


@pytest.mark.parametrize("x", [np.array([[0.1, -0.0, -np.inf, 2.0**-1074, 1e300]]),  # (1, 5)
                               np.array([[True, False], [False, True]]),  # (2, 2)
                               np.array([[3, -1, 0]], dtype=np.int32)])  # (1, 3)
def test_a_literal_carries_exactly_the_array_its_text_spells(x):
    """Drawn problems copy a literal's carried array instead of parsing its text: both must be the
    same array, bit for bit and dtype for dtype, or the reproducer would not rebuild what was run."""
    parsed = {"np": np}
    exec(literal("x", x), parsed)  # noqa: S102
    carried = run([literal("x", x)], {"np": np})["x"]
    assert carried.dtype == parsed["x"].dtype
    assert carried.tobytes() == parsed["x"].tobytes()


def test_statements_run_in_order_around_literals():
    """Statements before and after a literal see the variables as a plain exec would."""
    lines = ["a = np.ones(2)", literal("b", np.array([2.0, 3.0])), "b[0] = a.sum()", "c = b * 2"]
    env = run(lines, {"np": np})
    plain = {"np": np}
    exec("\n".join(lines), plain)  # noqa: S102
    for name in "abc":
        assert np.array_equal(env[name], plain[name])
    assert lines[1].value[0] == 2.0  # the statement after it changed a copy, not the literal


def test_run_suite_refuses_no_backend():
    with pytest.raises(ValueError, match="backend_names"):
        run_suite([])


def test_unknown_backend_is_a_usage_error_naming_it():
    result = run_suite(["no-such-backend"], timeout=120)
    assert result.returncode == 4  # pytest's usage-error exit code
    assert "unknown backend 'no-such-backend'" in result.output


def test_ci_seed_follows_the_commit_unless_given(tmp_path):
    """ci draws change with the commit (issue 12: not the same draws forever), reproducibly."""
    import subprocess

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


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_amplitude_handles_the_formats_extremes(dtype):
    """A key at the smallest normal number: the goal/S ratio overflows float64 (it raised
    OverflowError inside a draw); the amplitude still lands the scores at or below the cap."""
    from attnspec.properties.strategies import SCORE_CAP, _amplitude, score_terms

    tiny = float(np.finfo(dtype).tiny)
    q, k = np.array([[[[0.0], [1.0]]]]), np.array([[[[0.0], [tiny]]]])

    @settings(max_examples=20, database=None, deadline=None)
    @given(st.data())
    def check(data):
        j = _amplitude(data.draw, dtype, q, k, 1.0, 1)
        assert score_terms(q * 2.0**j, k * 2.0**j, 1.0) <= SCORE_CAP[dtype]

    check()
