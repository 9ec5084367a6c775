"""Run the conformance suite on chosen backends from Python, in a fresh interpreter.

    from attnspec.properties.runner import run_suite
    result = run_suite(["numpy-naive", "mypkg.attn:sdpa"], extra_args=["-x"])
    result.returncode, result.conformance, result.semantics, result.failed

A subprocess keeps Hypothesis' state, imported frameworks and a hanging backend's thread
out of the caller.  ``python -m properties.runner NAME ...`` does the same from a shell.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.path.join(ROOT, "properties")


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


def run_suite(backend_names, json_path: str | None = None, extra_args=(), profile: str | None = None,
              timeout: float | None = None, env: dict | None = None, pythonpath=()) -> SuiteResult:
    """pytest over properties/ for `backend_names` (names or package.module:attr).

    json_path: where the JSON results go (a temporary file when None); extra_args: more pytest
    arguments (e.g. ``["-x"]`` to stop at the first failure, ``["-k", "rows_sum"]``);
    profile: ATTNSPEC_PROFILE (dev, ci, thorough); pythonpath: folders to import plug-ins from.
    """
    if isinstance(backend_names, str):
        backend_names = [backend_names]
    if not backend_names:
        raise ValueError("backend_names must name at least one backend")
    own_json = json_path is None
    if own_json:
        fd, json_path = tempfile.mkstemp(prefix="attnspec-", suffix=".json")
        os.close(fd)
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join([ROOT, *pythonpath, child_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if profile:
        child_env["ATTNSPEC_PROFILE"] = profile  # properties/profiles.py
    cmd = [sys.executable, "-m", "pytest", SUITE, "-q", "-p", "no:cacheprovider", "--attnspec-json", json_path]
    cmd += [a for name in backend_names for a in ("--backend", name)] + list(extra_args)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=child_env, capture_output=True, text=True, timeout=timeout)
        try:
            with open(json_path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = {}
    finally:
        if own_json and os.path.exists(json_path):
            os.remove(json_path)
    return SuiteResult(proc.returncode, data.get("conformance", []), data.get("semantics", []),
                       proc.stdout + proc.stderr)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    names = [a for a in args if not a.startswith("-")]
    if not names:
        print("usage: python -m properties.runner BACKEND [BACKEND ...] [pytest options]", file=sys.stderr)
        return 2
    result = run_suite(names, extra_args=[a for a in args if a.startswith("-")])
    print(result.output)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
