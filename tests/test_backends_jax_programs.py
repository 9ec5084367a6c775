"""JAX programs kept across processes (backends/jax_programs.py): the bits of plain jit, no trace on a hit."""
from __future__ import annotations

import os

import numpy as np
import pytest

from attnspec.backends import jax_programs
from attnspec.backends.jax_backends import JaxNaive
from attnspec.backends.registry import resolve

RNG = np.random.default_rng(7)
Q, K = RNG.standard_normal((2, 3, 5, 4)), RNG.standard_normal((2, 3, 6, 4))  # (B, H, Lq, E), (B, H, Lk, E)
G = RNG.standard_normal((2, 3, 5, 4))  # (B, H, Lq, Ev) the output's gradient
MASK = RNG.random((5, 6)) < 0.7  # (Lq, Lk)
BIAS = np.round(RNG.standard_normal((2, 3, 5, 6)) * 8) / 8  # (B, H, Lq, Lk) exact in float32


def _fresh(name: str):
    backend = resolve(name)
    ok, why = backend.availability()
    if not ok:
        pytest.skip(f"{name}: {why}")
    backend.load()
    return backend


def _results(backend, dtype="float32", scale=0.5):
    forward = backend.forward(Q, K, K, MASK, True, scale, dtype, bias=BIAS)
    grads = backend.backward(Q, K, K, G, MASK, True, scale, dtype, bias=BIAS)
    return [np.asarray(x) for x in (forward, *grads)]


def _programs(folder) -> list:
    return sorted(str(p) for p in folder.rglob("*.program"))


@pytest.fixture
def kept(tmp_path):
    jax_programs.enable(str(tmp_path))
    yield tmp_path
    jax_programs.enable(None)


@pytest.mark.parametrize("name", ["jax-naive", "jax-dpa"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_kept_program_gives_the_bits_of_plain_jit_and_traces_nothing(name, dtype, kept):
    jax_programs.enable(None)
    plain = _results(_fresh(name), dtype)
    jax_programs.enable(str(kept))
    stored = _results(_fresh(name), dtype)  # compiled and written
    assert len(_programs(kept)) == 2  # the forward and the vjp
    jax_programs._loaded.clear()  # as a new process: only the files are left
    backend = _fresh(name)
    backend._attend = None  # a trace would call it (and fail): a hit loads, it does not trace
    loaded = _results(backend, dtype)
    for a, b, c in zip(plain, stored, loaded, strict=True):
        assert a.dtype == b.dtype == c.dtype
        assert a.tobytes() == b.tobytes() == c.tobytes()


def test_programs_are_kept_apart_by_static_field_shape_and_adapter_class(kept):
    backend = _fresh("jax-dpa")
    _results(backend, scale=0.5)
    _results(backend, scale=0.25)  # jax-dpa jits on the scale: new programs
    assert len(_programs(kept)) == 4
    backend.forward(Q[:, :, :3], K, K, MASK[:3], True, 0.5, "float32", bias=BIAS[:, :, :3])  # another Lq
    assert len(_programs(kept)) == 5

    class Mine(JaxNaive):  # a plug-in's subclass: another class, its own programs
        name = "my-jax"

    mine = Mine()
    mine.load()
    _results(_fresh("jax-naive"))
    files = len(_programs(kept))
    _results(mine)
    assert len(_programs(kept)) == files + 2


def test_a_program_that_does_not_load_is_compiled_again(kept):
    want = _results(_fresh("jax-naive"))
    for f in _programs(kept):
        with open(f, "wb") as out:
            out.write(b"not a program")
    jax_programs._loaded.clear()
    got = _results(_fresh("jax-naive"))
    assert all(a.tobytes() == b.tobytes() for a, b in zip(want, got, strict=True))
    jax_programs._loaded.clear()  # the rewritten files load again
    backend = _fresh("jax-naive")
    backend._attend = None
    assert all(a.tobytes() == b.tobytes() for a, b in zip(want, _results(backend), strict=True))


def test_programs_of_an_older_adapter_source_are_removed(kept):
    """A folder per class and source: a changed adapter's old programs can never load again."""
    _results(_fresh("jax-naive"))
    (folder,) = {os.path.dirname(p) for p in _programs(kept)}
    stale = kept / "JaxNaive-0123456789abcdef"  # as an older jax_backends.py left it
    stale.mkdir()
    (stale / "x.program").write_bytes(b"old")
    other = kept / "JaxDpa-0123456789abcdef"  # another class's: kept
    other.mkdir()
    jax_programs.enable(str(kept))  # a new process
    _results(_fresh("jax-naive"))
    assert not stale.exists() and other.exists() and os.path.isdir(folder)


def test_a_folder_another_checkout_pruned_is_no_error(kept):
    """Two checkouts with different adapter sources share the folder: each prunes the other's folder
    of the class, maybe while the other writes into it; the program still runs (kept in memory)."""
    want = _results(_fresh("jax-naive"))
    (folder,) = {os.path.dirname(p) for p in _programs(kept)}
    jax_programs._loaded.clear()
    import shutil
    shutil.rmtree(folder)  # gone under this process, which believes it made it
    got = _results(_fresh("jax-naive"))  # raised FileNotFoundError from tempfile.mkstemp before
    assert all(a.tobytes() == b.tobytes() for a, b in zip(want, got, strict=True))
