"""The out-of-bounds probe (backends/bad_indices.py, issue 30 item 5): bad index arguments handed to a
backend's own hooks; whatever the hook does is an answer, never a crash; guard memory makes stray reads
show; a declared refusal is judged (properties/test_bad_indices.py)."""
from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from attnspec.backends import bad_indices as BI
from attnspec.backends.base import Unsupported
from attnspec.backends.numpy_backends import NumpyNaive, NumpyTiled
from attnspec.backends.numpy_formats import tiled_packed, tiled_paged
from attnspec.specs import formats as Fm
from tests.teeth_conventions import bad_index_verdicts

PAGED = [k for k, (fmt, _) in BI.BAD_INPUTS.items() if fmt == "paged"]
PACKED = [k for k, (fmt, _) in BI.BAD_INPUTS.items() if fmt == "packed"]


def _probe(backend, kind, dtype="float64"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return BI.probe(backend, kind, dtype)


class Scripted(NumpyTiled):
    """numpy-tiled whose hooks, on a bad call, do what `bad` says; the valid call as `valid` says."""

    name = "scripted"

    def __init__(self, bad, valid=None):
        super().__init__()
        self.bad, self.valid, self.calls = bad, valid, 0

    def _hook(self, real, *args):
        self.calls += 1
        act = self.valid if self.calls % 2 else self.bad  # the probe calls the valid arguments first
        return real(self, *args) if act is None else act()

    def native_packed(self, *args):
        return self._hook(tiled_packed, *args)

    def native_paged(self, *args):
        return self._hook(tiled_paged, *args)


def _raise(e):
    def act():
        raise e
    return act


@pytest.mark.parametrize("kind", list(BI.BAD_INPUTS))
@pytest.mark.parametrize("bad, observed", [
    (_raise(SystemError("a C extension's error")), "refused (SystemError)"),
    (_raise(Unsupported("not with these indices")), "refused (Unsupported)"),
    (lambda: "garbage", BI.NO_OUTPUT),
    (lambda: np.zeros((1, 2)), BI.NO_OUTPUT),
    (lambda: None, BI.NO_OUTPUT),
])
def test_whatever_the_hook_does_is_an_answer(kind, bad, observed):
    assert _probe(Scripted(bad), kind)[0] == observed


def test_a_valid_call_that_fails_leaves_nothing_to_judge():
    assert _probe(Scripted(None, _raise(Unsupported("no"))), "page_id_negative")[0] == "declined"
    assert _probe(Scripted(None, _raise(KeyError("x"))), "page_id_negative") == ("error on the valid call",
                                                                                   "KeyError: 'x'")
    with pytest.raises(Unsupported, match="takes no paged call"):
        BI.probe(replace_formats(NumpyTiled(), ("padded", "packed")), "table_too_short")


def replace_formats(backend, formats):
    backend.capabilities = replace(backend.capabilities, formats=formats)
    return backend


def _beyond(x, n=BI.GUARD):
    """A raw pointer's view of x: n rows more along axis 0 (and, for a 2-d table, n more columns), read
    from the memory past its end - as a C kernel that trusts its indices addresses it."""
    shape = (x.shape[0] + (n if x.ndim > 2 else 0),) + x.shape[1:-1] + (x.shape[-1] + (n if x.ndim == 2 else 0),)
    return np.lib.stride_tricks.as_strided(x, shape=shape, strides=x.strides, writeable=False)


class RawPointers(NumpyTiled):
    """numpy-tiled reading its caches, tokens and block table through views past their ends: an index out of
    range reads whatever memory follows, as a kernel on raw pointers does."""

    name = "raw-pointers"

    def native_packed(self, q, k, v, args, call):
        return tiled_packed(self, q, _beyond(k), _beyond(v), args, call)

    def native_paged(self, q, k_cache, v_cache, args, call):
        args = replace(args, block_table=_beyond(args.block_table))
        return tiled_paged(self, q, _beyond(k_cache), _beyond(v_cache), args, call)


@pytest.mark.parametrize("kind", ["cu_seqlens_past_tokens", "page_id_past_pool", "table_too_short"])
def test_guard_memory_shows_a_read_past_the_end(kind):
    """Past the tokens, past the pool, past the table's columns: the guard's NaN reaches the output
    (NumPy's own indexing refuses or clamps these: numpy-tiled answers otherwise)."""
    assert _probe(RawPointers(), kind)[0] == BI.OUT_OF_BOUNDS
    assert _probe(NumpyTiled(), kind)[0] != BI.OUT_OF_BOUNDS


@pytest.mark.parametrize("layout", Fm.PAGED_LAYOUTS)
def test_a_wrapped_page_id_lands_on_an_unused_page(layout):
    """NumPy wraps page id -1 to the pool's last page: unused, NaN, so the wrap shows in every layout."""
    tiled = replace_formats(NumpyTiled(), (f"paged-{layout}",))
    assert _probe(tiled, "page_id_negative") == (BI.OUT_OF_BOUNDS, "24 output values NaN")  # (B, H, Lq, Ev)


@pytest.mark.parametrize("kind", PAGED)
def test_a_kernel_that_validates_refuses_every_bad_paged_input(kind):
    """numpy-naive gathers pages with specs.formats.gather_paged, which validates: a ValueError each time."""
    assert _probe(NumpyNaive(), kind)[0] == "refused (ValueError)"


class Validating(NumpyTiled):
    """numpy-tiled that validates its index arguments first (specs.formats) and declares it."""

    name = "validating"
    semantics = replace(NumpyTiled.semantics, rejects_bad_indices=True)

    def native_packed(self, q, k, v, args, call):
        Fm.validate_packed(q, k, v, args.cu_seqlens_q, args.cu_seqlens_k, args.max_seqlen_q, args.max_seqlen_k,
                           args.seqused_k)
        return tiled_packed(self, q, k, v, args, call)

    def native_paged(self, q, k_cache, v_cache, args, call):
        Fm.validate_paged(k_cache, v_cache, args.block_table, args.cache_seqlens, args.cache_leftpad, args.layout)
        return tiled_paged(self, q, k_cache, v_cache, args, call)


def test_a_declared_refusal_is_held_to_every_bad_input():
    from tests.broken.serving_bugs import ClampsBadIndices
    refused = bad_index_verdicts(Validating(), "float32")
    assert all(refused) and len(refused) == len(BI.BAD_INPUTS)
    clamps = bad_index_verdicts(ClampsBadIndices(), "float64")
    assert len(clamps) == len(PAGED) and not any(clamps)  # every page id and column clamped onto some page
    with pytest.raises(Unsupported, match="declares no refusal"):
        bad_index_verdicts(NumpyTiled(), "float64")


def test_the_questions_record_undeclared_answers_and_judge_declared_ones(tmp_path):
    """One suite run: numpy-tiled's answers recorded (it reads out of bounds, no failure), the validating
    kernel's judged and passed, the clamping one that declares a refusal failed on each paged question."""
    from attnspec.properties.runner import run_suite
    here = Path(__file__).parents[1]
    result = run_suite(["numpy-tiled", "tests.broken.serving_bugs:ClampsBadIndices",
                        "tests.test_backends_bad_indices:Validating"], json_path=str(tmp_path / "out.json"),
                       extra_args=["-k", "bad_index"], profile="dev", cwd=str(tmp_path), pythonpath=[str(here)],
                       timeout=300)
    rows = {(r["backend"], r["property"], r["dtype"]): r["status"] for r in result.conformance}
    answers = {(r["backend"], r["question"], r["dtype"]): r for r in result.semantics}
    for kind in BI.BAD_INPUTS:  # asked in float32 (float64 where that is all it takes), skipped in the others
        assert rows[("numpy-tiled", f"bad_index_{kind}", "float32")] == "recorded", result.output[-3000:]
        assert answers[("numpy-tiled", f"bad_index_{kind}", "float32")]["agrees"] is None
        assert rows[("numpy-tiled", f"bad_index_{kind}", "float16")] == "skipped"
        assert rows[("validating", f"bad_index_{kind}", "float32")] == "passed"
        assert answers[("validating", f"bad_index_{kind}", "float32")]["observed"] == "refused (ValueError)"
    for kind in PAGED:
        assert rows[("broken-clamps-bad-indices", f"bad_index_{kind}", "float64")] == "failed"
    for kind in PACKED:
        assert rows[("broken-clamps-bad-indices", f"bad_index_{kind}", "float64")] == "skipped"  # no packed call
    assert not any(s == "error" for s in rows.values())


def test_a_plain_function_declares_it():
    """declare(rejects_bad_indices=True) on a kvcache function: held to each bad paged input - here the
    twin's NumPy indexing raises past the pool and the table, and wraps -1 silently (a finding)."""
    from attnspec.backends.plain import declare, function_backend
    from tests.broken import flash_twins

    def kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, softmax_scale=None, causal=False):
        return flash_twins.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                                   block_table=block_table, softmax_scale=softmax_scale, causal=causal)
    backend = function_backend(declare(kvcache, rejects_bad_indices=True), "kvcache")
    assert backend.describe()["rejects_bad_indices"] is True
    verdicts = {v.name: bool(v) for v in bad_index_verdicts(backend, "float64")}
    assert verdicts == {"bad_index_page_id_past_pool": True, "bad_index_page_id_negative": False,
                        "bad_index_table_too_short": True}
