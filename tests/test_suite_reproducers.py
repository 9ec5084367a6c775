"""Reproducers reproduce: every property's snippet runs in a fresh process, with 2-D and 4-D masks,
sets up its own import path, and replays the backend calls a stateful bug needs.

The broken backends live in a plug-in package written to a temporary folder outside the
checkout, and the snippets run with neither that folder nor PYTHONPATH given: the snippet's
own ``sys.path.insert`` (from `Target.import_paths`) must find it.
"""
from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import attnspec.properties as properties
from attnspec.properties import judge
from attnspec.properties.judge import ConformanceFailure
from attnspec.properties.plugin import make_targets
from attnspec.properties.strategies import MASK_KINDS

NAN_BACKEND = '''
"""Every output, LSE and gradient NaN: each property must catch it."""
import numpy as np
from attnspec.backends.numpy_backends import NumpyNaive


class NanEverywhere(NumpyNaive):
    name = "nan-everywhere"

    def native_attention(self, q, k, v, call):
        y = super().native_attention(q, k, v, call)
        return (y[0] * np.nan, y[1] * np.nan) if call.return_lse else y * np.nan

    def native_attention_backward(self, q, k, v, grad_out, call):
        return tuple(g * np.nan for g in super().native_attention_backward(q, k, v, grad_out, call))
'''

STATEFUL_BACKEND = '''
"""A runtime whose scratch buffer goes stale when the shape changes: a call that follows a call
of another shape gets its last query row shifted by one.  Correct for the first call of a process."""
from attnspec.backends.base import Backend, Capabilities, Semantics
from attnspec.backends.numpy_backends import NumpyNaive

_CORRECT = NumpyNaive()


class AfterReshape(Backend):
    name = "after-reshape"
    capabilities = Capabilities(dtypes=("float64",))
    semantics = Semantics(fully_masked="zeros", causal_alignment="top_left")

    def __init__(self, name="after-reshape", equal_head_dims=False):
        self.name, self.before = name, None
        if equal_head_dims:  # no Ev != E probe: the first problem is the first call
            self.capabilities = Capabilities(dtypes=("float64",), equal_head_dims=True)

    def native_forward(self, q, k, v, mask, is_causal, scale):
        out = _CORRECT.native_forward(q, k, v, mask, is_causal, scale)  # (..., Lq, Ev)
        shape = (q.shape, k.shape, v.shape)
        if self.before is not None and shape != self.before:
            out = out.copy()
            out[..., -1, :] += 1.0  # (..., Ev) the stale buffer
        self.before = shape
        return out


after_probe = AfterReshape()                                       # its bug shows after the Ev != E probe
after_example = AfterReshape("after-example", equal_head_dims=True)  # ... after an earlier example
'''

_SNIPPET_RUNNER = '''
import json, runpy, sys, traceback
import numpy as np
found = {}
for path in sys.argv[1:]:
    try:
        ns = runpy.run_path(path, run_name="__main__")
    except BaseException:
        found[path] = ["raised", traceback.format_exc()[-1500:]]
        continue
    outputs = [k for k in ("out", "out2", "lse", "dq", "dk", "dv", "w")
               if isinstance(ns.get(k), np.ndarray) and np.isnan(ns[k]).any()]
    found[path] = ["ran", outputs]
print("RESULT" + json.dumps(found))
'''


def _clean_env() -> dict:
    """No PYTHONPATH: a snippet must set up its own import path (attnspec itself is installed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ATTNSPEC_BACKENDS", "ATTNSPEC_JSON")}
    return env


@pytest.fixture
def plugin_folder(tmp_path, monkeypatch):
    """A plug-in package `reprobugs` in a temporary folder outside the checkout, importable here."""
    folder = tmp_path / "userland"
    (folder / "reprobugs").mkdir(parents=True)
    (folder / "reprobugs" / "__init__.py").write_text("")
    (folder / "reprobugs" / "nan_everywhere.py").write_text(NAN_BACKEND)
    (folder / "reprobugs" / "stateful.py").write_text(STATEFUL_BACKEND)
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    for name in [m for m in sys.modules if m == "reprobugs" or m.startswith("reprobugs.")]:
        del sys.modules[name]


def _masks_of(ndim: int):
    """judge.cases with every drawn mask made 2-D (Lq, Lk) or 4-D (B, H, Lq, Lk); draws without a
    mask kind (a property asking for causal only) are left alone."""
    real = judge.cases

    def reshape(case):
        if case.mask is None or case.mask.ndim == ndim:
            return case
        if ndim == 2:
            return case.then("mask = mask[0, 0].copy()  # one (Lq, Lk) mask for every batch and head")
        d = case.dims
        return case.then(f"mask = np.broadcast_to(mask, ({d['B']}, {d['H']}, {d['Lq']}, {d['Lk']})).copy()")

    def cases(dtype, caps, **kw):
        asked = kw.pop("kinds", MASK_KINDS)
        kinds = [k for k in asked if "mask" in k or k == "empty_rows"]
        if not kinds:  # the property's own kinds, not the default (which would draw unshaped masks)
            return real(dtype, caps, kinds=asked, **kw)
        return real(dtype, caps, kinds=kinds, **kw).map(reshape)
    return cases


def every_property():
    """(family, name, function) of every property test, collected from the families' modules."""
    for family in properties.families():
        if family == "semantics":  # asks questions, raises no ConformanceFailure (tests/test_suite_semantics.py)
            continue
        module = importlib.import_module(f"properties.test_{family}")
        for name, fn in vars(module).items():
            if name.startswith("test_") and getattr(fn, "__module__", "") == module.__name__:
                yield family, name, fn


def _failure(fn, target) -> ConformanceFailure | str:
    """Run one property on target until it fails (no shrinking: the first failing example)."""
    target.examples, target.unsupported, target.in_hypothesis = 0, "", True
    target.current_property = fn.__name__.removeprefix("test_")
    try:
        if hasattr(fn, "hypothesis"):
            inner = fn.hypothesis.inner_test

            @settings(max_examples=20, phases=[Phase.generate], database=None, deadline=None,
                      suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
            @given(data=st.data())
            def run(data):
                inner(target=target, data=data)
            run()
        else:
            fn(target=target)
    except ConformanceFailure as e:
        return e
    except BaseException as e:  # noqa: BLE001 - a skip or a harness error: reported by name
        return f"{type(e).__name__}: {str(e)[:300]}"
    return "passed"


def test_every_propertys_reproducer_runs_in_a_fresh_process_with_2d_and_4d_masks(plugin_folder, tmp_path,
                                                                                    monkeypatch):
    target = next(t for t in make_targets("reprobugs.nan_everywhere:NanEverywhere") if t.dtype == "float64")
    assert target.import_paths == (str(plugin_folder),)  # the folder holding the top package, from its file
    files, problems, mask_dims = {}, {}, {}
    props = list(every_property())
    assert len(props) >= 30  # every family's properties, collected (a rename must not empty this test)
    for family, name, fn in props:
        for ndim in (2, 4):
            monkeypatch.setattr(judge, "cases", _masks_of(ndim))
            found = _failure(fn, target)
            monkeypatch.undo()
            monkeypatch.syspath_prepend(str(plugin_folder))
            if not isinstance(found, ConformanceFailure):
                problems[(name, ndim)] = f"did not fail with a reproducer: {found}"
                continue
            if found.case.mask is not None:
                mask_dims[(name, ndim)] = found.case.mask.ndim
            path = tmp_path / "snippets" / f"{name}-{ndim}d.py"
            path.parent.mkdir(exist_ok=True)
            path.write_text(found.snippet)
            files[str(path)] = (name, ndim)
    # the masks were what was asked for, wherever the property draws one
    assert {key: d for key, d in mask_dims.items() if d != key[1]} == {}
    assert len(mask_dims) >= 40, sorted(mask_dims)
    proc = subprocess.run([sys.executable, "-c", _SNIPPET_RUNNER, *files], cwd=str(tmp_path), env=_clean_env(),
                          capture_output=True, text=True, timeout=600)
    assert "RESULT" in proc.stdout, proc.stderr[-3000:]
    for path, (how, detail) in json.loads(proc.stdout.split("RESULT", 1)[1]).items():
        if how == "raised":
            problems[files[path]] = f"the snippet raised:\n{detail}"
        elif not detail:
            problems[files[path]] = "the snippet ran but its outputs show no NaN (it does not reproduce)"
    assert not problems, "\n\n".join(f"{name} ({ndim}-D mask): {why}" for (name, ndim), why in sorted(problems.items()))


def _pytest(args, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=str(cwd),
                          env=env, capture_output=True, text=True, timeout=600)


def _reproducer_paths(output: str, cwd) -> dict:
    """backend -> the reproducer file each failure block names."""
    found = {}
    for backend, rel in re.findall(r"failed on backend '([^']+)'.*?\n  reproducer: python (\S+)", output, re.S):
        found[backend] = os.path.join(str(cwd), rel)
    return found


def _without_earlier_calls(snippet: str) -> str:
    """The snippet with every replayed earlier call left out: set-up, then the failing call alone."""
    lines = snippet.splitlines()
    setup = next(i for i, line in enumerate(lines) if line.startswith("backend = resolve("))
    failing = lines.index("# the failing call")
    return "\n".join(lines[:setup + 1] + lines[failing:])


def test_a_stateful_bug_is_caught_and_its_reproducer_replays_the_calls_before_it(plugin_folder, tmp_path):
    """The bug shows only after a call of another shape (ORT's compiled-model case): the
    reproducer, run in a fresh process, replays the earlier call and shows the error; without
    that call the same failing call is correct - the replay is what reproduces it."""
    work = tmp_path / "work"
    work.mkdir()
    env = dict(_clean_env(), PYTHONPATH=str(plugin_folder))  # pytest finds the plug-in; the snippet must not need it
    proc = _pytest(["--pyargs", "properties", "-k", "test_matches_reference",
                    "--backend", "reprobugs.stateful:after_probe", "--backend", "reprobugs.stateful:after_example"],
                   work, env)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    paths = _reproducer_paths(proc.stdout, work)
    assert set(paths) == {"after-reshape", "after-example"}, proc.stdout[-3000:]
    for backend, path in paths.items():
        snippet = open(path, encoding="utf-8").read()
        assert "# call 1: made before the failing one" in snippet, snippet
        errors = []
        for text in (snippet, _without_earlier_calls(snippet)):
            run = subprocess.run([sys.executable, "-c", text], cwd=str(tmp_path), env=_clean_env(),
                                 capture_output=True, text=True, timeout=120)
            assert run.returncode == 0, run.stderr[-2000:]
            errors.append(float(run.stdout.strip().splitlines()[-1]))  # max |out - expected| on judged rows
        assert errors[0] >= 0.5 and errors[1] < 1e-9, (backend, errors, textwrap.shorten(snippet, 400))
