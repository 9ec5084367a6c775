"""Compiled JAX programs kept across processes, under a key of everything their trace depends on.

JAX's persistent compilation cache (which the suite turns on: ~/.cache/attnspec/jax) skips
XLA's compile, not the tracing and lowering before it, and a run of the suite builds hundreds
of programs on jax-naive and jax-dpa (new shapes, dtypes and static fields): tracing and lowering
them was most of those backends' time (docs/measurements.md).  This cache keeps each compiled
executable (``jax.experimental.serialize_executable``) under a key of what its trace depends on: the backend's class and the
source of every module its class hierarchy is defined in (a changed adapter is a new key), the
static configuration the adapter jits on (``JaxBackend._static``), the arguments' tree, shapes
and dtypes, x64, the device, and the versions of jax and jaxlib.  A hit loads the executable jit
compiled for that very key (far cheaper than a trace) and runs it; a miss compiles through the
backend's own jit (past JAX's own cache: see `_compile`) and stores it.  A file that does not load is compiled
again and replaced, never an error.  Programs live in a folder per class and source
(``<dir>/JaxDpa-<source hash>/``); a new source of a class removes its older folders.

Opt-in: ``ATTNSPEC_JAX_CACHE=DIR`` (read when a JAX backend loads) turns on JAX's persistent
compilation cache in DIR/xla and this one in DIR/programs; without it every call is plain jit.
attnspec's checkout turns it on for its own runs (conftest.py).  tests/test_backends_jax_programs.py
checks that a hit gives the bits plain jit gives and traces nothing.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import shutil
import sys
import tempfile

DIRECTORY: str | None = None  # where programs are kept; None: every call is plain jit
MAX_IN_MEMORY = 4096  # loaded programs kept per process
_loaded: dict = {}
_salts: dict = {}
_folders: set = set()


ENV = "ATTNSPEC_JAX_CACHE"


def from_environment(jax) -> None:
    """Both caches in $ATTNSPEC_JAX_CACHE's folder when it is set (once a process); a folder that
    cannot be made leaves plain jit."""
    root = os.environ.get(ENV, "").strip()
    if not root or DIRECTORY is not None:
        return
    try:
        enable(os.path.join(root, "programs"))
        os.makedirs(os.path.join(root, "xla"), exist_ok=True)
    except OSError:
        return
    jax.config.update("jax_compilation_cache_dir", os.path.join(root, "xla"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def enable(directory: str | None) -> None:
    """Keep programs in `directory` from now on (None: off)."""
    global DIRECTORY
    if directory is not None:
        os.makedirs(directory, exist_ok=True)
    DIRECTORY = directory
    _loaded.clear()
    _folders.clear()


def _salt(backend, jax) -> str:
    """The backend's class, the source of the modules of its class hierarchy, jax's versions, the device."""
    cls = type(backend)
    if cls not in _salts:
        h = hashlib.sha256()
        for klass in cls.__mro__:
            path = getattr(sys.modules.get(klass.__module__), "__file__", None)
            if path and os.path.exists(path):
                with open(path, "rb") as f:
                    h.update(f.read())
        import jaxlib

        device = backend.jax_device
        h.update(f"{cls.__module__}.{cls.__qualname__} {backend.name} jax {jax.__version__} jaxlib "
                 f"{jaxlib.__version__} {device.platform} {device.device_kind}".encode())
        _salts[cls] = h.hexdigest()
    return _salts[cls]


def call(backend, key: tuple, jitted, args: tuple):
    """jitted(*args), through a kept program when the cache is on."""
    if DIRECTORY is None:
        return jitted(*args)
    jax = backend.jax
    leaves, tree = jax.tree.flatten(args)
    signature = (str(tree), tuple((tuple(x.shape), str(x.dtype), bool(getattr(x, "weak_type", False)))
                                  for x in leaves), bool(jax.config.jax_enable_x64))
    salt = _salt(backend, jax)
    full = repr((salt, key, signature))
    program = _loaded.get(full)
    if program is None:
        path = _path(full, salt, type(backend))
        program = _load(full, path) or _compile(full, path, jitted, args)
        if len(_loaded) >= MAX_IN_MEMORY:
            _loaded.clear()
        _loaded[full] = program
    return program(*args)


def _path(full: str, salt: str, cls) -> str:
    """DIRECTORY/<class>-<salt>/<key hash>.program: one folder per adapter source."""
    folder = os.path.join(DIRECTORY, f"{cls.__qualname__}-{salt[:16]}")
    if folder not in _folders:
        _prune(cls.__qualname__, folder)
        os.makedirs(folder, exist_ok=True)
        _folders.add(folder)
    return os.path.join(folder, hashlib.sha256(full.encode()).hexdigest() + ".program")


def _prune(name: str, keep: str) -> None:
    """Another folder of this class is an older source's: its programs can never be loaded again."""
    for entry in os.listdir(DIRECTORY):
        old = os.path.join(DIRECTORY, entry)
        if entry.startswith(name + "-") and old != keep and os.path.isdir(old):
            shutil.rmtree(old, ignore_errors=True)


def _load(full: str, path: str):
    if not os.path.exists(path):
        return None
    try:
        from jax.experimental import serialize_executable

        with open(path, "rb") as f:
            stored_key, payload, in_tree, out_tree = pickle.load(f)
        if stored_key != full:  # a hash collision, or not ours
            return None
        return serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
    except Exception:  # noqa: BLE001 - unreadable or from elsewhere: compile it again
        return None


def _compile(full: str, path: str, jitted, args):
    # past JAX's persistent cache: an executable it loaded serialises without its code (running
    # that copy in another process fails: "Function ... not found"); this cache replaces it here
    with _without_jax_cache():
        program = jitted.lower(*args).compile()
    try:
        from jax.experimental import serialize_executable

        payload, in_tree, out_tree = serialize_executable.serialize(program)
    except Exception:  # noqa: BLE001 - not serialisable: this process still has it in memory
        return program
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    except OSError:  # its folder went: another checkout's source of the class pruned it (_prune)
        return program
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump((full, payload, in_tree, out_tree), f)
        os.replace(tmp, path)  # atomic: another process may write the same program
    except OSError:  # no room: this process still has it in memory
        with contextlib.suppress(OSError):
            os.remove(tmp)
    return program


@contextlib.contextmanager
def _without_jax_cache():
    import jax

    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)  # the suite calls backends on one thread
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
