"""attnspec's conformance suite: Hypothesis properties of scaled dot-product attention.

Run it on your implementation from any folder (attnspec installed)::

    pytest --pyargs attnspec.properties --backend mypkg.attn:sdpa

or inside your own test suite, one module (scikit-learn's ``parametrize_with_checks`` idea)::

    # tests/test_attention_conformance.py
    from attnspec import install

    install(globals(), "mypkg.attn:sdpa")          # every family; or families=("output", "masking")

Importing this package loads no framework and no Hypothesis profile.  (Every import here is
absolute: pytest may load the property modules of a checkout under a name of their own.)
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

    The tests are attnspec's own, parametrized by the attnspec pytest plugin (loaded with attnspec
    installed) with these backends only, whatever ``--backend`` says; a failure prints one block
    with the path of a runnable reproducer.  A backend that cannot be loaded fails the module's
    collection with the reason.
    """
    if not isinstance(namespace, dict) or "__name__" not in namespace:
        raise ValueError("install: namespace must be a test module's globals()")
    if not backends:
        raise ValueError("install: name at least one backend, e.g. install(globals(), 'mypkg.attn:sdpa')")
    known = _all_families()
    chosen = known if families is None else list(families)
    if isinstance(families, str) or [f for f in chosen if f not in known]:
        raise ValueError(f"install: families must be a tuple of {', '.join(known)}; got {families!r}")
    if "attnspec.properties.plugin" not in sys.modules:
        raise RuntimeError("install: attnspec's pytest plugin is not loaded (pytest loads it through attnspec's "
                           "entry point unless plugin autoloading is off): run pytest with -p attnspec.properties.plugin")
    from attnspec.properties.plugin import INSTALLED

    added = []
    for family in chosen:
        module = importlib.import_module(f"attnspec.properties.test_{family}")
        for name, fn in vars(module).items():
            if not (name.startswith("test_") and callable(fn) and hasattr(fn, "property")):
                continue
            if name in namespace and namespace[name] is not fn:
                raise ValueError(f"install: {namespace['__name__']} already defines {name}")
            namespace[name] = fn
            added.append(name)
    namespace[INSTALLED] = tuple(dict.fromkeys(_spec_of(b) for b in backends))
    return added
