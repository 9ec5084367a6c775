"""torch-flex's packed call (backends/flex_formats.py): one flex_attention call over the concatenated
tokens with document masks, judged against the reference at the edges the packed family names."""
from __future__ import annotations

import numpy as np
import pytest

from attnspec.backends import serving
from attnspec.backends.registry import resolve
from attnspec.specs import error_budget, reference
from attnspec.specs.masks import alibi_slopes


@pytest.fixture(scope="module")
def flex():
    backend = resolve("torch-flex")
    ok, why = backend.availability()
    if not ok:
        pytest.skip(why)
    return backend


def _edge(alignment):
    """B = 4 with one query in all (total_q = 1 < B), a sequence with no key, left padding, GQA and
    every per-sequence field: a slip in the document ids or the per-sequence diagonal moves the one row."""
    rng = np.random.default_rng(306)
    q, k, v = rng.standard_normal((4, 4, 3, 8)), rng.standard_normal((4, 2, 7, 8)), rng.standard_normal((4, 2, 7, 5))
    fields = dict(enable_gqa=True, positions="per_sequence", q_lengths=np.array([0, 0, 1, 0]),
                  kv_lengths=np.array([7, 0, 6, 2]), kv_starts=np.array([0, 0, 2, 1]), is_causal=True,
                  causal_alignment=alignment, alibi_slopes=alibi_slopes(4), window=(2, None), softcap=3.0)
    return q, k, v, fields


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_flex_packed_equals_reference_at_zero_length_sequences(flex, dtype, alignment):
    q, k, v, fields = _edge(alignment)
    q, k, v = (error_budget.round_to(x, dtype) for x in (q, k, v))
    f = reference.forward(q, k, v, **fields)
    assert (~f.empty_rows).sum() == 4  # the one query row of sequence 2, in each of its 4 heads
    out, lse = serving.forward_packed(flex, q, k, v, dtype, return_lse=True, tail=2, unused=2, rng=3, **fields)
    verdict = error_budget.check_forward(np.where(f.empty_rows[..., None], 0.0, out), q, k, v, dtype=dtype,
                                         rows=~f.empty_rows, **fields)
    assert verdict, verdict.message
    assert (out[f.empty_rows] == 0).all()  # rows no sequence owns or that see no key: the declared zeros
    assert np.isneginf(lse[f.empty_rows]).all()
    lse_verdict = error_budget.check_lse(np.where(f.empty_rows, 0.0, lse), q, k, v, dtype=dtype, rows=~f.empty_rows,
                                         **fields)
    assert lse_verdict, lse_verdict.message


def test_flex_packed_reads_no_token_past_the_sequences(flex):
    """NaN past cu_seqlens[-1] and past seqused_k (the lowering's fill) must not reach a row: eager flex
    multiplies a hidden key's zero weight with its value, so the adapter zeroes those tokens first."""
    q, k, v, fields = _edge("bottom_right")
    out = serving.forward_packed(flex, q, k, v, "float64", tail=3, unused=3, rng=5, fill=np.nan, **fields)
    assert np.isfinite(out).all()
    clean = serving.forward_packed(flex, q, k, v, "float64", tail=3, unused=3, rng=5, fill=0.0, **fields)
    assert np.array_equal(out, clean)
