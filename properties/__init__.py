"""attnspec's conformance suite: Hypothesis properties of scaled dot-product attention.

Run it on your implementation from any folder (attnspec installed)::

    pytest --pyargs properties --backend mypkg.attn:sdpa

or inside your own test suite, one module (scikit-learn's ``parametrize_with_checks`` idea)::

    # tests/test_attention_conformance.py
    from attnspec.properties import install

    install(globals(), "mypkg.attn:sdpa")          # every family; or families=("output", "masking")

Importing this package loads no framework and no Hypothesis profile.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
import sys

__all__ = ["install", "families"]


def families() -> list[str]:
    """The property families, by module: test_output.py is "output"."""
    here = os.path.dirname(os.path.abspath(__file__))
    return sorted(m.name[len("test_"):] for m in pkgutil.iter_modules([here]) if m.name.startswith("test_"))


_all_families = families  # install's parameter has the same name


def _spec_of(backend) -> str:
    """'package.module:attr' for a backend given as an object (the reproducer resolves it by name)."""
    if isinstance(backend, str):
        if not backend.strip():
            raise ValueError("install: backend must be a non-empty name or object; got ''")
        return backend.strip()
    module = getattr(backend, "__module__", None) or getattr(type(backend), "__module__", None)
    qualname = getattr(backend, "__qualname__", None)
    if module and qualname and "<locals>" not in qualname:
        return f"{module}:{qualname}"
    mod = importlib.import_module(module) if module else None
    for name, value in vars(mod).items() if mod else ():
        if value is backend:
            return f"{module}:{name}"
    raise ValueError(f"install: cannot name {backend!r} as package.module:attr (a reproducer imports it by "
                     "that name); give that string, or define it at a module's top level")


def install(namespace: dict, *backends, families: tuple | None = None) -> list[str]:
    """Put the conformance suite's tests into a test module, run on `backends`.

    namespace: the test module's ``globals()``.  backends: names as ``--backend`` takes them
    (built-in, entry point, ``package.module:attr``) or the objects themselves (a plain
    function, a Backend class or object defined at a module's top level).  families: module
    names of `families()` to include (default: all).  Returns the names of the tests added.

    The tests are attnspec's own functions, parametrized by the attnspec pytest plugin (loaded
    with attnspec installed) with these backends only, whatever ``--backend`` says; the
    module's failures print as one block each with the path of a runnable reproducer.
    """
    if not isinstance(namespace, dict) or "__name__" not in namespace:
        raise ValueError("install: namespace must be a test module's globals()")
    if not backends:
        raise ValueError("install: name at least one backend, e.g. install(globals(), 'mypkg.attn:sdpa')")
    known = _all_families()
    chosen = known if families is None else list(families)
    if isinstance(families, str) or [f for f in chosen if f not in known]:
        raise ValueError(f"install: families must be a tuple of {', '.join(known)}; got {families!r}")
    if f"{__name__}.plugin" not in sys.modules:
        raise RuntimeError("install: attnspec's pytest plugin is not loaded (pytest loads it through attnspec's "
                           "entry point unless plugin autoloading is off): run pytest with -p properties.plugin")
    from attnspec.properties import profiles
    from attnspec.properties.plugin import INSTALLED

    try:
        profile = profiles.choose()
    except ValueError as e:
        raise ValueError(f"install: {e}") from None
    added = []
    with profiles.active(profile):  # Hypothesis binds a test's settings when its module is imported
        for family in chosen:
            module = importlib.import_module(f"{__name__}.test_{family}")
            marks = getattr(module, "pytestmark", [])
            for name, fn in vars(module).items():
                if not (name.startswith("test_") and callable(fn) and getattr(fn, "__module__", "") == module.__name__):
                    continue
                if name in namespace and namespace[name] is not fn:
                    raise ValueError(f"install: {namespace['__name__']} already defines {name}")
                _carry_module_marks(fn, marks)
                namespace[name] = fn
                added.append(name)
    namespace[INSTALLED] = tuple(dict.fromkeys(_spec_of(b) for b in backends))
    return added


def _carry_module_marks(fn, marks) -> None:
    """A property module's own marks (needs_gradients, filterwarnings) on each of its tests, once."""
    if getattr(fn, "_attnspec_module_marks", False):
        return
    for mark in marks if isinstance(marks, (list, tuple)) else [marks]:
        mark(fn)
    fn._attnspec_module_marks = True
