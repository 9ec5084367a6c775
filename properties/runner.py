"""Run the conformance suite on chosen backends from Python, in a fresh interpreter.

    from attnspec.properties.runner import run_suite
    result = run_suite(["numpy-naive", "mypkg.attn:sdpa"], extra_args=["-x"])
    result.returncode, result.conformance, result.semantics, result.failed

A subprocess keeps Hypothesis' state, imported frameworks and a hanging backend's thread out of
the caller.  It runs in the caller's folder and imports what the caller's shell can: the current
folder, PYTHONPATH, installed packages.  A run that could not start (an unknown backend, one
that does not import, a usage error) raises `SuiteError` with pytest's own words - never an
empty result that looks like a pass.  ``python -m attnspec.properties.runner NAME ...`` does
the same from a shell.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field


class SuiteError(RuntimeError):
    """The suite did not run (pytest's exit status 2-5, or no result at all)."""


@dataclass
class SuiteResult:
    returncode: int
    conformance: list = field(default_factory=list)  # rows: backend, property, dtype, status, examples, ...
    semantics: list = field(default_factory=list)    # rows: backend, question, observed, declared, agrees
    output: str = ""                                 # pytest's stdout + stderr

    @property
    def failed(self) -> list:
        """Conformance rows that failed or errored."""
        return [r for r in self.conformance if r["status"] in ("failed", "error")]


def _importable_env(env: dict | None = None, pythonpath=(), cwd: str | None = None) -> dict:
    """The caller's environment with its current folder and `pythonpath` importable."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (*pythonpath, cwd or os.getcwd(), out.get("PYTHONPATH", "")) if p)
    return out


def suite_command(backend_names, json_path: str, rows_path: str | None = None, extra_args=()) -> list:
    """The command line of a suite child, here and in `attnspec run` (attnspec/suites.py): pytest
    on the installed suite for `backend_names`, its JSON into json_path, its row stream (JSON
    lines, as each test finishes) into rows_path."""
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "attnspec.properties", "-p", "no:cacheprovider",
           "--attnspec-json", json_path]
    if rows_path:
        cmd += ["--attnspec-rows", rows_path]
    return cmd + [a for name in backend_names for a in ("--backend", name)] + list(extra_args)


def run_suite(backend_names, json_path: str | None = None, extra_args=(), profile: str | None = None,
              timeout: float | None = None, env: dict | None = None, pythonpath=(), cwd: str | None = None) -> SuiteResult:
    """pytest --pyargs attnspec.properties for `backend_names` (names or package.module:attr).

    json_path: where the JSON results go (a temporary file when None, removed after; the failures'
    reproducers go beside the JSON in <json>-repro/, which stays: the rows name its scripts); extra_args: more pytest
    arguments (e.g. ``["-x"]``, ``["-k", "rows_sum"]``); profile: ATTNSPEC_PROFILE (dev, ci, deep,
    thorough; default: deep for up to three backends); pythonpath: more folders to import plug-ins
    from; cwd: the folder to run in (default: the current one).
    """
    if isinstance(backend_names, str):
        backend_names = [backend_names]
    if not backend_names:
        raise ValueError("backend_names must name at least one backend")
    cwd = os.path.abspath(cwd or os.getcwd())
    own_json = json_path is None
    if own_json:
        fd, json_path = tempfile.mkstemp(prefix="attnspec-", suffix=".json")
        os.close(fd)
        os.remove(json_path)  # written by the run: its absence says the run wrote nothing
    environ = _importable_env(env, pythonpath, cwd)
    if profile:
        environ["ATTNSPEC_PROFILE"] = profile  # properties/profiles.py
    cmd = suite_command(backend_names, os.path.abspath(json_path), extra_args=["-q", *extra_args])
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout)
        try:
            with open(json_path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = None
    finally:
        if own_json and os.path.exists(json_path):
            os.remove(json_path)
    output = proc.stdout + proc.stderr
    if proc.returncode not in (0, 1) or data is None:
        tail = "\n".join(line for line in output.strip().splitlines()[-8:])
        raise SuiteError(f"the suite did not run on {', '.join(backend_names)} (pytest exit status "
                         f"{proc.returncode}):\n{tail}")
    return SuiteResult(proc.returncode, data.get("conformance", []), data.get("semantics", []), output)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    names = [a for a in args if not a.startswith("-")]
    if not names:
        print("usage: python -m attnspec.properties.runner BACKEND [BACKEND ...] [pytest options]", file=sys.stderr)
        return 2
    try:
        result = run_suite(names, extra_args=[a for a in args if a.startswith("-")])
    except SuiteError as e:
        print(e, file=sys.stderr)
        return 2
    print(result.output)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
