"""Reproducers reproduce: in every property family a planted bug fails, and the reproducer its failure
writes runs alone in a fresh process (``python file``, from another folder, without PYTHONPATH),
prints the very verdict of the suite's failure block and exits 1.  A backend that keeps state
between calls: the reproducer replays the earlier calls (skipping those the backend declines)
and says so; a stateless failure is reproduced by the problem alone.

The planted bugs are tests/broken's kernels (each with one slip; tests/broken/__init__.py says
which family catches which) and tests/plugins' (planted.py, strided.py, deviating.py), run once,
each restricted to its family with ``-k``, seeded, and unshrunk (--attnspec-no-shrink: the first
failing problem, often large enough to travel in an .npz); reproducers of shrunk failures are
checked by the stateful run below and in tests/test_suite_plugin.py.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import attnspec.properties as properties
from attnspec.properties.repro import find_property
from attnspec.properties.runner import run_suite

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# family -> (the planted backend, the name it reports, the dtype it is run in)
PLANTED = {
    "weights": ("tests.broken.seed_mistakes:SumNormalised", "broken-sum-normalised", "bfloat16"),
    "masking": ("tests.broken.mask_bugs:CausalIgnoredWithoutMask", "broken-causal-ignored-without-mask", "float64"),
    "output": ("tests.broken.seed_mistakes:ScaleByD", "broken-scale-by-d", "float64"),
    "structure": ("tests.plugins.planted:ValuesOfTheNextSlice", "planted-values-of-the-next-slice", "float64"),
    "gradients": ("tests.broken.gradient_bugs:DqMissingScale", "broken-dq-missing-scale", "float64"),
    "edges": ("tests.broken.kernel_bugs:TailBlockZeroPad", "broken-tail-block-zero-pad", "float64"),
    "layouts": ("tests.plugins.strided:AssumesContiguous", "assumes-contiguous", "float64"),
    "grouped_heads": ("tests.broken.variant_bugs:KvHeadModulo", "broken-kv-head-modulo", "float64"),
    "bias": ("tests.broken.variant_bugs:FloatMaskAsBool", "broken-float-mask-as-bool", "float64"),
    "alignment": ("tests.broken.variant_bugs:CausalBottomRightAsTopLeft", "broken-bottom-right-as-top-left", "float16"),
    "lse": ("tests.broken.variant_bugs:LseUnscaled", "broken-lse-unscaled", "float64"),
    "windows": ("tests.broken.variant_bugs:WindowLeftExclusive", "broken-window-left-exclusive", "float64"),
    "sequences": ("tests.plugins.deviating:LeaksPaddingNaN", "leaks-padding-nan", "float64"),
    "softcap": ("tests.broken.variant_bugs:SoftcapAfterMask", "broken-softcap-after-mask", "float64"),
    "alibi": ("tests.broken.variant_bugs:AlibiPow2Slopes", "broken-alibi-pow2-slopes", "float64"),
    "packed": ("tests.broken.serving_bugs:PaddedSeqlenK", "broken-padded-seqlen-k", "float32"),
    "paged": ("tests.broken.serving_bugs:IgnoresCacheLeftpad", "broken-ignores-cache-leftpad", "float32"),
    "semantics": ("tests.broken.kernel_bugs:NaNForFullyMaskedDeclaredZeros", "broken-nan-fully-masked-declared-zeros",
                  "float64"),
    "sinks": ("tests.broken.sink_bugs:SinkIgnored", "broken-sink-ignored", "float64"),
    "conventions": ("tests.broken.variant_bugs:EmptyLsePlusInfDeclaredMinusInf", "broken-empty-lse-plus-inf", "float16"),
    "merge": ("tests.broken.convention_bugs:MergeAverages", "broken-merge-averages", "float64"),
    "knobs": ("tests.broken.convention_bugs:KnobDropsTail", "broken-knob-drops-tail", "float32"),
    "fp8": ("tests.broken.fp8_bugs:DescalesDropped", "broken-fp8-dropped", "float8_e4m3fn"),
    "bad_indices": ("tests.broken.serving_bugs:ClampsBadIndices", "broken-clamps-bad-indices", "float64"),
}


def _clean_env() -> dict:
    """No PYTHONPATH: a reproducer sets up its own import path (attnspec itself is installed)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("ATTNSPEC_")}


def family_of(prop: str) -> str:
    for family in properties.families():
        try:
            find_property(family, prop)
            return family
        except AttributeError:
            continue
    raise KeyError(prop)


def failure_blocks(output: str) -> dict:
    """test id -> the text of its block in pytest's FAILURES section."""
    section = output.split("= FAILURES =", 1)[1].split("\n", 1)[1]
    section = re.split(r"\n=+ attnspec: per backend", section)[0]
    # pytest centres the test id in a line of underscores: a long id keeps only one or two on each side
    parts = re.split(r"(?:^|\n)_+ (test_\S+) _+\n", section)
    # under pytest-xdist each block starts with the worker's line ("[gw0] linux -- Python ...")
    return {name: re.sub(r"^\[gw\d+\] .*\n", "", text) for name, text in zip(parts[1::2], parts[2::2], strict=True)}


def verdict_of_block(block: str) -> list:
    """The failure block's verdict lines (message, where, how much/allowed) and its problem line."""
    lines = block.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("  problem: "))
    return lines[1:end + 1]


def run_reproducer(path: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, path], cwd=str(cwd), env=_clean_env(), capture_output=True, text=True,
                          timeout=300)


def run_all(paths, cwd) -> dict:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(paths, pool.map(lambda p: run_reproducer(p, cwd), paths), strict=True))


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    """One run of the suite: each planted backend on its own family, in the dtype chosen above."""
    work = tmp_path_factory.mktemp("planted")
    only = " or ".join(f"(test_{family}.py and {name}-{dtype})" for family, (_, name, dtype) in PLANTED.items())
    result = run_suite([spec for spec, _, _ in PLANTED.values()], json_path=str(work / "out.json"),
                       extra_args=["-k", only, "--hypothesis-seed=0", "--attnspec-examples=12", "--attnspec-no-shrink"],
                       profile="dev", cwd=str(work), pythonpath=[ROOT], timeout=900)
    return work, result


def test_the_planted_bugs_cover_every_family():
    assert sorted(PLANTED) == properties.families()


@pytest.mark.slow
def test_every_family_fails_on_its_planted_bug_with_a_reproducer(planted_run):
    work, result = planted_run
    failed = [r for r in result.conformance if r["status"] == "failed"]
    by_family = {}
    for r in failed:
        by_family.setdefault(family_of(r["property"]), set()).add(r["backend"])
        assert r["reproducer"] and os.path.isfile(r["reproducer"]), r
        assert os.path.dirname(r["reproducer"]) == str(work / "out-repro")  # beside the JSON
    assert {f: b for f, b in by_family.items()} == {f: {name} for f, (_, name, _) in PLANTED.items()}, \
        result.output[-4000:]
    assert not [r for r in result.conformance if r["status"] == "error"], result.output[-4000:]
    assert result.returncode == 1


@pytest.mark.slow
def test_every_reproducer_runs_alone_in_a_fresh_process_and_prints_the_suites_verdict(planted_run, tmp_path):
    work, result = planted_run
    blocks = failure_blocks(result.output)
    failed = [r for r in result.conformance if r["status"] == "failed"]
    assert len(blocks) == len(failed) >= len(PLANTED), sorted(blocks)
    paths = {}
    for test_id, block in blocks.items():
        rel = re.search(r"\n  reproducer: python (\S+)", block).group(1)
        paths[os.path.join(str(work), rel)] = (test_id, block)
    assert set(paths) == {r["reproducer"] for r in failed}
    runs = run_all(sorted(paths), tmp_path)  # from another folder, without PYTHONPATH
    problems = {}
    for path, run in runs.items():
        test_id, block = paths[path]
        prop, backend, dtype = re.match(r"(\S+) failed on backend '([^']+)' at (\S+)", block).groups()
        head = f"{prop} FAILED on backend {backend!r} at {dtype} (the problem alone, in a fresh process)"
        lines = run.stdout.splitlines()
        expected = verdict_of_block(block)
        if run.returncode != 1:
            problems[test_id] = f"exit status {run.returncode}:\n{run.stdout[-1500:]}{run.stderr[-1500:]}"
        elif lines[:1] != [head] or lines[1:1 + len(expected)] != expected:
            problems[test_id] = "a verdict other than the suite's:\n" + "\n".join(
                ["suite:", block.splitlines()[0], *expected, "reproducer:", *lines])
    assert not problems, "\n\n".join(f"{k}: {why}" for k, why in sorted(problems.items()))
    # the JSON's row says the same as the terminal's block
    for r in failed:
        test_id, block = paths[r["reproducer"]]
        assert r["message"] == "\n".join(block.splitlines()[:len(r["message"].splitlines())]), (r["message"], block)


@pytest.mark.slow
def test_a_large_problem_travels_in_an_npz_beside_its_reproducer(planted_run):
    work, result = planted_run
    (edges,) = [r for r in result.conformance if r["property"] == "edge_shapes_match_reference"]
    npz = edges["reproducer"][:-3] + ".npz"
    assert os.path.isfile(npz) and os.path.basename(npz) in Path(edges["reproducer"]).read_text(encoding="utf-8")


# ---- state kept between calls ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def stateful_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("stateful")
    result = run_suite(["tests.plugins.planted:AfterReshape", "tests.plugins.planted:ValuesOfTheNextSlice"],
                       json_path=str(work / "out.json"), extra_args=["-n", "0", "-k", "test_matches_reference or "
                                                                     "test_batch_head_independence"],
                       profile="dev", cwd=str(work), pythonpath=[ROOT], timeout=600)
    return work, result


@pytest.mark.slow
def test_a_stateful_bug_is_reproduced_by_replaying_the_earlier_calls_the_declined_ones_skipped(stateful_run, tmp_path):
    """The bug shows only after a call of other shapes: the problem alone passes in a fresh process, so
    the reproducer replays the calls the suite had made before it - the Ev != E probe among them,
    which the backend declines (Unsupported) and the replay skips - and the failing call still fails."""
    work, result = stateful_run
    blocks = failure_blocks(result.output)
    row = next(r for r in result.conformance if r["backend"] == "planted-after-reshape"
               and r["property"] == "matches_reference")
    assert row["status"] == "failed", result.output[-3000:]
    block = blocks["test_matches_reference[planted-after-reshape-float64]"]
    text = Path(row["reproducer"]).read_text(encoding="utf-8")
    earlier = re.search(r"^EARLIER = (.*)$", text, re.M).group(1)
    assert "The problem alone PASSED in a fresh process" in text  # checked when written: the history is kept
    assert "(1, 1, 3, 3)" in earlier  # the suite's Ev != E probe (E = 2, Ev = 3): a call the backend declines
    run = run_reproducer(row["reproducer"], tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    first = run.stdout.splitlines()[0]
    found = re.search(r"after replaying (\d+) earlier call\(s\) of the suite's run \((\d+) the backend declined or "
                      r"failed, skipped\): the backend keeps state\)$", first)
    assert first.startswith("matches_reference FAILED on backend 'planted-after-reshape' at float64 (") and found, first
    assert int(found.group(1)) >= 1 and int(found.group(2)) >= 1, first
    assert run.stdout.splitlines()[1:1 + len(verdict_of_block(block))] == verdict_of_block(block)
    # without the earlier calls the same problem passes: the replay is what reproduces it
    alone = tmp_path / "alone.py"
    alone.write_text(re.sub(r"^EARLIER = .*$", "EARLIER = []", text, flags=re.M))
    run = run_reproducer(str(alone), tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines() == [
        "matches_reference PASSED on backend 'planted-after-reshape' at float64 (the problem alone, in a fresh "
        "process)", "  the property holds here now"]


@pytest.mark.slow
def test_a_stateless_failure_is_reproduced_by_the_problem_alone(stateful_run, tmp_path):
    work, result = stateful_run
    row = next(r for r in result.conformance if r["backend"] == "planted-values-of-the-next-slice"
               and r["property"] == "batch_head_independence")
    assert row["status"] == "failed", result.output[-3000:]
    text = Path(row["reproducer"]).read_text(encoding="utf-8")
    # checked in a fresh process when written: it fails alone, so the suite's earlier calls are left out
    assert re.search(r"^EARLIER = \[\]$", text, re.M) and "fails alone in a fresh process" in text
    run = run_reproducer(row["reproducer"], tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.splitlines()[0] == ("batch_head_independence FAILED on backend "
                                          "'planted-values-of-the-next-slice' at float64 (the problem alone, in a "
                                          "fresh process)")
    assert "replaying" not in run.stdout
    assert run.stdout.splitlines()[1:len(row["message"].splitlines())] == row["message"].splitlines()[1:]


ENV_DEPENDENT = '''
import os
import numpy as np
from attnspec.backends import declare


@declare(dtypes=("float64",), env=("MYKERNEL_BUGGY", "MYKERNEL_OTHER"))
def sdpa(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """Correct, unless MYKERNEL_BUGGY=1 (a kernel whose behaviour an environment variable switches)."""
    s = (query @ np.swapaxes(key, -1, -2)) * (query.shape[-1] ** -0.5 if scale is None else scale)
    vis = np.ones(s.shape[-2:], dtype=bool) if attn_mask is None else attn_mask
    if is_causal:
        vis = vis & np.tri(*s.shape[-2:], dtype=bool)
    s = np.where(vis, s, -np.inf)
    e = np.exp(s - np.nan_to_num(s.max(-1, keepdims=True, initial=-np.inf), neginf=0))
    out = (e / np.where(e.sum(-1, keepdims=True) == 0, 1, e.sum(-1, keepdims=True))) @ value
    return out + (1.0 if os.environ.get("MYKERNEL_BUGGY") == "1" else 0.0)
'''


@pytest.mark.slow
def test_a_reproducer_carries_the_declared_environment_and_the_versions_of_the_run(tmp_path):
    """declare(env=...): the script records the run's values, sets them again (a variable the shell
    lacks, or has when the run had not) and says so; a version that differs from the run's is printed."""
    from tests.test_suite_plugin import _env, _project, _pytest

    project = _project(tmp_path, {"mypkg/__init__.py": "", "mypkg/attn.py": ENV_DEPENDENT})
    run_env = _env(ATTNSPEC_PROFILE="dev", MYKERNEL_BUGGY="1")
    run_env.pop("MYKERNEL_OTHER", None)
    proc = _pytest(["--pyargs", "attnspec.properties", "--backend", "mypkg.attn:sdpa", "-k", "test_matches_reference",
                    "--attnspec-json", "out.json"], project, run_env)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    import json
    row = next(r for r in json.loads((project / "out.json").read_text())["conformance"] if r["status"] == "failed")
    text = Path(row["reproducer"]).read_text(encoding="utf-8")
    assert "RUN_ENV = {'MYKERNEL_BUGGY': '1', 'MYKERNEL_OTHER': None}" in text
    versions = eval(re.search(r"^RUN_VERSIONS = (\{.*?\})", text, re.M).group(1))  # noqa: S307 - our own literal
    import numpy
    assert versions["numpy"] == numpy.__version__ and "attnspec" in versions
    # the user's shell: MYKERNEL_BUGGY unset (without it the problem passes), MYKERNEL_OTHER set
    shell = dict(_clean_env(), MYKERNEL_OTHER="x")
    shell.pop("MYKERNEL_BUGGY", None)
    run = subprocess.run([sys.executable, row["reproducer"]], cwd=str(tmp_path), env=shell, capture_output=True,
                         text=True, timeout=300)
    lines = run.stdout.splitlines()
    assert run.returncode == 1, run.stdout + run.stderr
    assert lines[:2] == ["environment: MYKERNEL_BUGGY='1' set, as in the run (it was unset here)",
                         "environment: MYKERNEL_OTHER unset, as in the run (it was 'x' here)"], lines
    assert lines[2].startswith("matches_reference FAILED on backend 'mypkg.attn:sdpa' at float64"), lines
    # a run on another numpy: the difference is printed before the verdict, which still follows
    other = tmp_path / "other_numpy.py"
    other.write_text(text.replace(f"'numpy': '{numpy.__version__}'", "'numpy': '0.0.1'"))
    same = {k: v for k, v in shell.items() if k != "MYKERNEL_OTHER"}
    run = subprocess.run([sys.executable, str(other)], cwd=str(tmp_path), env=dict(same, MYKERNEL_BUGGY="1"),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"version differs from the run's: numpy 0.0.1 in the run, {numpy.__version__} here" in run.stdout.splitlines()
    assert "environment:" not in run.stdout  # both variables as in the run: nothing to set
