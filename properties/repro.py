"""Reproducers: a failure written as a script that runs the property's own check again, alone.

The script holds the failing problem as arrays - exact literals (``repr`` of a float round-trips)
when small, an ``.npz`` beside it when large - and calls `replay`, which resolves the backend,
runs the very check the suite ran and prints the same verdict (property, where, how much,
allowed).  It tries the failing problem alone first, in the fresh process the script is; only
when that passes does it replay the backend calls the suite had made before (their
configurations, with random values; a call the backend declines is skipped) and try again,
saying so: a backend that keeps state between calls.  Exit status 1 while the failure stands.

When the suite writes a script for a failure it runs it once without the history, in a fresh
process (`needs_history`): a failure that stands alone keeps no history (most do), one that
needs the earlier calls keeps them and says so.

A failure of the knobs family names the knob setting it ran at (``KNOBS = {...}``): the script replays it,
and ``KNOBS = {}`` runs the same check at the defaults.  The calls replayed before a failure carry
their knob settings too.

The script also carries what the run depended on: the environment variables the backend declares
(``declare(env=...)``, or a Backend's ``env_vars``), as the run had them, and the versions of
attnspec, NumPy and the frameworks the run had loaded.  Running it sets a declared variable the
shell lacks or has otherwise (unsets one the run did not have), says so, and prints each version
that differs from the run's before the verdict.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys

import numpy as np

from attnspec.properties.run_context import restore_run, run_environment, run_versions  # noqa: F401 (the scripts')

LITERAL_MAX = 256  # entries: larger arrays go to an .npz beside the script
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def file_name(backend: str, dtype: str, prop: str, n: int = 0) -> str:
    stem = "-".join(_UNSAFE.sub("_", part).strip("_") or "_" for part in (backend, dtype, prop))
    return f"{stem}{'' if n == 0 else f'-{n + 1}'}.py"


def _number(x) -> str:
    if isinstance(x, (bool, np.bool_)):
        return repr(bool(x))
    if isinstance(x, (int, np.integer)):
        return repr(int(x))
    x = float(x)
    if x != x:
        return "np.nan"
    if x in (np.inf, -np.inf):
        return "np.inf" if x > 0 else "-np.inf"
    return repr(x)


def _nested(x) -> str:
    if isinstance(x, list):
        return "[" + ", ".join(_nested(e) for e in x) + "]"
    return _number(x)


def literal(x: np.ndarray) -> str:
    """``np.array([...], dtype=...)`` that rebuilds x exactly (an empty array by its shape)."""
    if x.size == 0:
        return f"np.zeros({tuple(x.shape)!r}, dtype=np.{x.dtype.name})"
    return f"np.array({_nested(x.tolist())}, dtype=np.{x.dtype.name})" if x.ndim else f"np.{x.dtype.name}({_number(x)})"


def _value(x) -> str:
    if isinstance(x, np.ndarray):
        return literal(x)
    if isinstance(x, (list, tuple)):
        inner = ", ".join(_value(e) for e in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner}{',' if len(x) == 1 else ''})"
    if isinstance(x, (float, np.floating, int, np.integer, bool, np.bool_)):
        return _number(x)
    return repr(x)


def arrays_of(failure) -> dict:
    """Every array of the failing problem and parameters, by the name the script gives it."""
    c = failure.case
    named = {"q": c.q, "k": c.k, "v": c.v}
    if c.mask is not None:
        named["mask"] = c.mask
    named.update({f"fields_{n}": x for n, x in c.fields.items() if isinstance(x, np.ndarray)})
    named.update({f"params_{n}": x for n, x in failure.params.items() if isinstance(x, np.ndarray)})
    return named


HISTORY_NOTE = {
    None: "# The backend's calls before this problem in the suite's run (shapes and fields, not values): replayed\n"
          "# only when the problem alone does not fail.",
    False: "# The problem fails alone in a fresh process (checked when the suite wrote this script): no earlier\n"
           "# call is needed.",
    True: "# The problem alone PASSED in a fresh process when the suite wrote this script: it fails only after\n"
          "# the backend's earlier calls below (shapes and fields, not values), replayed first - the backend keeps\n"
          "# state between calls.",
}


def script(failure, headline: str, import_paths=(), npz: str | None = None, history: bool | None = None) -> str:
    """The reproducer's text; arrays as literals, or loaded from `npz` (a file name beside the script).
    history: None (not checked: the earlier calls kept), False (fails alone: none kept), True (needed)."""
    c, t = failure.case, failure.target
    arrays = arrays_of(failure)
    lines = ["#!/usr/bin/env python3", *("# " + x for x in headline.splitlines()), "#",
             "# Written by attnspec.  It runs the property's own check on the problem below and prints the",
             "# verdict; exit status 1 while the failure stands.  Run it from anywhere: python <this file>",
             "import sys", ""]
    if import_paths:
        lines += [f"sys.path[:0] = {list(import_paths)!r}  # where the backend's package lives", ""]
    lines += [f"RUN_ENV = {run_environment(t.session.backend)!r}  # the environment variables the backend "
              "declares, as the run had them (None: unset): set so again",
              f"RUN_VERSIONS = {run_versions()!r}  # what the run had loaded: a version that differs is printed", ""]
    lines += ["import numpy as np", ""]
    if npz:
        lines += ["import os", f"data = np.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), {npz!r}))"]
        source = {n: f"data[{n!r}]" for n in arrays}
    else:
        source = {n: literal(x) for n, x in arrays.items()}
    shapes = {"q": "(B, Hq, Lq, E)", "k": "(B, Hkv, Lk, E)", "v": "(B, Hkv, Lk, Ev)", "mask": "True = takes part"}
    for n in ("q", "k", "v", "mask"):
        if n in source:
            lines.append(f"{n} = {source[n]}  # {shapes[n]}")
    if c.mask is None:
        lines.append("mask = None")
    fields = {n: source.get(f"fields_{n}") or _value(x) for n, x in c.fields.items()}
    params = {n: source.get(f"params_{n}") or _value(x) for n, x in failure.params.items()}
    if isinstance(failure.params.get("knobs"), dict):  # a knob setting is what the failure needs: in plain sight
        lines.append(f"KNOBS = {_value(failure.params['knobs'])}  # the tuning knobs (Backend.knobs) of the failing "
                     "call, replayed; {} runs every knob at its default")
        params["knobs"] = "KNOBS"
    lines += [f"fields = dict({', '.join(f'{n}={x}' for n, x in fields.items())})  # the problem's optional fields",
              f"params = dict({', '.join(f'{n}={x}' for n, x in params.items())})  # what the property drew besides",
              f"problem = dict(q=q, k=k, v=v, mask=mask, is_causal={c.is_causal!r}, scale={_value(c.scale)}, "
              f"fields=fields, label={c.label!r})",
              HISTORY_NOTE[history],
              f"EARLIER = {[] if history is False else [tuple(s) for s in failure.earlier]!r}", "",
              "if __name__ == '__main__':",
              "    from attnspec.properties.repro import replay, restore_run",
              "    restore_run(RUN_ENV, RUN_VERSIONS)",
              f"    sys.exit(replay({t.session.spec!r}, {t.dtype!r}, {failure.prop.family!r}, "
              f"{failure.prop.name!r}, problem, params, EARLIER, rule={t.rule!r}))", ""]
    return "\n".join(lines)


def write(folder: str, failure, headline: str, import_paths=(), n: int = 0, check_alone: bool = False) -> tuple[str, str]:
    """(path, text) of the reproducer written into folder (an .npz beside it for a large problem).
    check_alone: run it once without the history in a fresh process and keep the history only if needed."""
    os.makedirs(folder, exist_ok=True)
    name = file_name(failure.target.name, failure.target.dtype, failure.prop.name, n)
    path = os.path.join(folder, name)
    arrays = arrays_of(failure)
    npz = None
    if sum(x.size for x in arrays.values()) > LITERAL_MAX:
        npz = name[:-3] + ".npz"
        np.savez_compressed(os.path.join(folder, npz), **arrays)
    elif os.path.exists(path[:-3] + ".npz"):
        os.remove(path[:-3] + ".npz")
    if check_alone and failure.earlier:
        alone = script(failure, headline, import_paths, npz, history=False)
        _save(path, alone)
        history = needs_history(path)
        if history is False:
            return path, alone
    else:
        history = False if check_alone else None
    text = script(failure, headline, import_paths, npz, history)
    _save(path, text)
    return path, text


ALONE_TIMEOUT = 300  # seconds for the fresh-process check: importing a framework and compiling once


def needs_history(path: str) -> bool | None:
    """Run the script (written without history) in a fresh process: False when the failure stands
    alone, True when the problem passes alone (the history is needed), None when undecided."""
    import subprocess

    try:
        done = subprocess.run([sys.executable, path], capture_output=True, timeout=ALONE_TIMEOUT,
                              cwd=os.getcwd(), env=dict(os.environ))
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode == 1 and b" FAILED on backend " in done.stdout:  # not an exception's exit status 1
        return False
    return True if done.returncode == 0 else None


def _save(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def forget(folder: str, backend: str, dtype: str, prop: str) -> None:
    """A check that passes now: its reproducers from an earlier run would mislead."""
    stem = file_name(backend, dtype, prop)[:-3]
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        base, ext = os.path.splitext(name)
        if ext in (".py", ".npz") and (base == stem or (base.startswith(stem + "-") and base[len(stem) + 1:].isdigit())):
            with contextlib.suppress(OSError):  # removed meanwhile (another worker): nothing to clear
                os.remove(os.path.join(folder, name))


# ---- running one (what the script calls) ------------------------------------------------------

def find_property(family: str, name: str):
    import importlib
    module = importlib.import_module(f"attnspec.properties.test_{family}")
    return getattr(module, f"test_{name}").property


def _earlier_call(backend, sig) -> None:
    """One call of a recorded configuration with random values (it only brings the backend to its state)."""
    kind, dtype, qs, ks, vs, ms, causal, scale, fields, lse, layout, *rest = sig  # rest: the knobs (older: none)
    knobs = dict(rest[0]) if rest and rest[0] else None
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in (qs, ks, vs))
    kw = {}
    for entry in fields:
        name, what = entry[0], entry[1]
        if what == "value":
            kw[name] = entry[2]
            continue
        shape, values = entry[2], entry[4]
        if values is not None:
            kw[name] = np.array(values)
        elif name in ("q_lengths", "kv_lengths"):
            kw[name] = np.full(shape, qs[-2] if name == "q_lengths" else ks[-2])
        elif name.endswith("segment_ids"):
            kw[name] = np.zeros(shape, dtype=np.int64)
        else:
            kw[name] = np.zeros(shape)
    mask = None if ms is None else np.ones(ms, dtype=bool)
    if kind == "backward":
        backend.backward(q, k, v, np.ones(qs[:-1] + vs[-1:]), mask, causal, scale, dtype,
                         **({"knobs": knobs} if knobs else {}), **kw)
    else:
        extra = {} if layout == "contiguous" else {"layout": layout}
        if knobs:
            extra["knobs"] = knobs
        backend.forward(q, k, v, mask, causal, scale, dtype, return_lse=lse, **extra, **kw)


def _once(prop, target, case, params):
    """(status, verdict or reason): 'failed', 'passed' or 'declined'."""
    from attnspec.properties.explore import Counterexample, attempt
    from attnspec.properties.target import Declined
    try:
        attempt(prop, target, case, params)
    except Counterexample as f:
        return "failed", f.verdict
    except Declined as e:
        return "declined", str(e)
    return "passed", None


def replay(backend: str, dtype: str, family: str, name: str, problem: dict, params: dict, earlier=(),
           rule: str = "attnspec", out=None) -> int:
    """Run property `name` of `family` on the backend at dtype with this problem; print the verdict.
    0: it passes, 1: it fails, 2: the backend declines the problem."""
    from attnspec.backends.base import BackendFailure, Unsupported
    from attnspec.backends.registry import resolve
    from attnspec.properties.case import Case
    from attnspec.properties.results import verdict_lines
    from attnspec.properties.target import Session, Target

    out = out or sys.stdout
    prop = find_property(family, name)
    session = Session(resolve(backend), backend)
    target = Target(session, dtype, rule=rule)
    case = Case(**problem)
    say = lambda text: print(text, file=out, flush=True)  # noqa: E731
    status, found = _once(prop, target, case, params)
    how = "the problem alone, in a fresh process"
    if status == "passed" and earlier:
        replayed, skipped = 0, 0
        for sig in earlier:
            try:
                _earlier_call(session.backend, sig)
                replayed += 1
            except (Unsupported, BackendFailure, ValueError):  # declined, or failing: not the state we need
                skipped += 1
        status, found = _once(prop, target, case, params)
        how = (f"after replaying {replayed} earlier call(s) of the suite's run ({skipped} the backend declined "
               f"or failed, skipped): {'the backend keeps state' if status == 'failed' else 'still passes'}")
    head = f"{name} {status.upper()} on backend {session.backend.name!r} at {dtype} ({how})"
    if status == "failed":
        say("\n".join([head] + verdict_lines(found)))
        say(f"  problem: {case!r}")
        return 1
    if status == "declined":
        say(f"{head}\n  the backend declines this problem: {found}")
        return 2
    say(f"{head}\n  the property holds here now")
    return 0
