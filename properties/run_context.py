"""What a run depended on, carried by its reproducers: declared environment variables, versions.

A backend declares the environment variables its behaviour depends on (``declare(env=...)`` for a
plain function, ``env_vars`` on a Backend: ``TRITON_INTERPRET``); a reproducer records their values
in the run and the versions of attnspec, NumPy and every framework the run had loaded, and
`restore_run` sets the variables again before the backend is resolved (a framework reads some at
import) and prints each version that differs.  A differing version is reported, not refused: the
verdict that follows says whether the failure stands.  Imports no framework.
"""
from __future__ import annotations

import os
import sys

# modules whose versions a run depends on when it has loaded them -> their distribution's name
FRAMEWORKS = {"attnspec": "attnspec", "numpy": "numpy", "torch": "torch", "jax": "jax", "jaxlib": "jaxlib",
              "triton": "triton", "ml_dtypes": "ml-dtypes", "flax": "flax", "keras": "keras",
              "transformers": "transformers", "mlx": "mlx", "onnxruntime": "onnxruntime", "openvino": "openvino"}


def version_of(module: str) -> str | None:
    """The installed version of a module's distribution (its __version__ if it has no metadata); None: absent."""
    from importlib import metadata

    try:
        return metadata.version(FRAMEWORKS.get(module, module))
    except metadata.PackageNotFoundError:
        return getattr(sys.modules.get(module), "__version__", None)


def run_versions() -> dict:
    """{module: version} of attnspec, NumPy and every framework this process has loaded."""
    loaded = [m for m in FRAMEWORKS if m in ("attnspec", "numpy") or m in sys.modules]
    return {m: v for m in loaded if (v := version_of(m)) is not None}


def run_environment(backend) -> dict:
    """{name: value or None (unset)} of the environment variables the backend declares it depends on."""
    return {name: os.environ.get(name) for name in backend.env_vars}


def restore_run(env: dict, versions: dict, out=None) -> None:
    """Set the run's declared environment variables here (saying which changed) and print the versions
    that differ from the run's: called by a reproducer before it resolves the backend."""
    out = out or sys.stdout
    for name, value in (env or {}).items():
        here = os.environ.get(name)
        if here == value:
            continue
        if value is None:
            os.environ.pop(name, None)
            print(f"environment: {name} unset, as in the run (it was {here!r} here)", file=out, flush=True)
        else:
            os.environ[name] = value
            was = "unset" if here is None else f"{here!r}"
            print(f"environment: {name}={value!r} set, as in the run (it was {was} here)", file=out, flush=True)
    differ = [(m, v, version_of(m)) for m, v in (versions or {}).items() if version_of(m) != v]
    for m, run, here in differ:
        print(f"version differs from the run's: {m} {run} in the run, {here or 'not installed'} here",
              file=out, flush=True)
