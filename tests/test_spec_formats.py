"""Call formats (specs/formats.py): packed and paged lowering, raising back, and bad input named."""
from __future__ import annotations

import numpy as np
import pytest

from attnspec.specs import formats as Fm
from attnspec.specs import reference
from attnspec.specs.problem import validate


def _problem(Ev=6, **kw):
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((3, 4, 5, 8)), rng.standard_normal((3, 2, 9, 8)), rng.standard_normal((3, 2, 9, Ev))
    base = dict(enable_gqa=True, positions="per_sequence", q_lengths=np.array([5, 0, 2]),
                kv_lengths=np.array([9, 3, 7]), kv_starts=np.array([0, 1, 4]))
    return validate(q, k, v, **{**base, **kw})


def test_packed_holds_each_sequence_in_order_and_fills_the_rest():
    p = _problem()
    pk = Fm.to_packed(p, tail=3, unused=2, rng=0)
    assert pk.cu_seqlens_q.tolist() == [0, 5, 5, 7] and pk.cu_seqlens_q.dtype == np.int32
    assert pk.seqused_k.tolist() == [9, 2, 3]
    span = np.diff(pk.cu_seqlens_k)
    assert (span >= pk.seqused_k).all() and pk.max_seqlen_k == span.max() and pk.max_seqlen_q == 5
    assert pk.q.shape == (7 + 3, 4, 8) and pk.k.shape == (pk.cu_seqlens_k[-1] + 3, 2, 8)
    np.testing.assert_array_equal(pk.q[5:7], np.swapaxes(p.query[2, :, :2], 0, 1))
    c = pk.cu_seqlens_k
    np.testing.assert_array_equal(pk.k[c[2]:c[2] + 3], np.swapaxes(p.key[2, :, 4:7], 0, 1))  # from kv_starts
    assert np.isnan(pk.k[c[2] + 3:c[3]]).all() and np.isnan(pk.q[7:]).all() and np.isnan(pk.v[c[3]:]).all()
    assert Fm.validate_packed(pk.q, pk.k, pk.v, pk.cu_seqlens_q, pk.cu_seqlens_k, pk.max_seqlen_q, pk.max_seqlen_k,
                              pk.seqused_k) == 3


def test_from_packed_puts_rows_back_and_the_reference_of_each_sequence_is_its_own():
    p = _problem(is_causal=True, causal_alignment="bottom_right")
    pk = Fm.to_packed(p)
    full = reference.forward(p).output  # (3, 4, 5, 6)
    rows = []
    for b in range(3):  # each sequence alone, its keys from kv_starts, bottom-right at its own lengths
        qb = p.query[b:b + 1, :, :p.q_lengths[b]]
        kb, vb = (x[b:b + 1, :, p.kv_starts[b]:p.kv_lengths[b]] for x in (p.key, p.value))
        rows.append(np.swapaxes(reference.forward(qb, kb, vb, is_causal=True, causal_alignment="bottom_right",
                                                  enable_gqa=True).output[0], 0, 1))
    back = Fm.from_packed(np.concatenate(rows), pk.cu_seqlens_q, 5)
    np.testing.assert_allclose(back, full, rtol=1e-13, atol=1e-15)
    assert (back[1] == 0).all() and (back[2, :, 2:] == 0).all()


def test_lse_from_packed():
    lse = np.arange(8.0).reshape(2, 4)  # (Hq, total_q)
    out = Fm.lse_from_packed(lse, np.array([0, 3, 4], dtype=np.int32), 3)  # (2, 2, 3)
    assert out[0].tolist() == [[0, 1, 2], [4, 5, 6]] and out[1, :, 0].tolist() == [3, 7]
    assert np.isneginf(out[1, :, 1:]).all()


@pytest.mark.parametrize("layout", Fm.PAGED_LAYOUTS)
@pytest.mark.parametrize("page_size", [1, 2, 3, 5, 16])
def test_paged_gathers_back_to_the_contiguous_keys(layout, page_size):
    p = _problem(Ev=8 if layout.startswith("stacked-") else 6)  # one stacked tensor: Ev == E
    pg = Fm.to_paged(p, page_size, layout, rng=page_size)
    assert pg.page_size == page_size and pg.block_table.dtype == np.int32
    assert Fm.validate_paged(pg.k_cache, pg.v_cache, pg.block_table, pg.cache_seqlens, pg.cache_leftpad, layout) == 3
    need = -(-np.array([9, 3, 7]) // page_size)
    assert pg.k_cache.shape[0] >= 2 * need.sum()  # a pool 2-3x the need
    owned = np.concatenate([pg.block_table[b, :need[b]] for b in range(3)])
    assert len(set(owned.tolist())) == need.sum()  # no page shared
    unused = np.setdiff1d(np.arange(pg.k_cache.shape[0]), owned)
    assert np.isnan(pg.k_cache[unused]).all()
    k, v = Fm.gather_paged(pg.k_cache, pg.v_cache, pg.block_table, pg.cache_seqlens, layout, Lk=9)
    for b in range(3):
        s, e = p.kv_starts[b], p.kv_lengths[b]
        np.testing.assert_array_equal(k[b, :, s:e], p.key[b, :, s:e])
        np.testing.assert_array_equal(v[b, :, s:e], p.value[b, :, s:e])
        assert np.isnan(k[b, :, :s]).all()  # the left padding is never written
    assert (k[1, :, 3:] == 0).all()


@pytest.mark.parametrize("base", ["NHD", "HND"])
def test_a_stacked_cache_holds_the_separate_caches_numbers(base):
    """stacked-NHD / stacked-HND: index 0 of axis 1 the keys, 1 the values, exactly the separate caches of
    the same placement; an append's reference update writes the same slots."""
    p = _problem(Ev=8)
    sep, st = Fm.to_paged(p, 3, base, rng=2), Fm.to_paged(p, 3, f"stacked-{base}", rng=2)
    assert st.v_cache is None and st.k_cache.shape == (sep.k_cache.shape[0], 2) + sep.k_cache.shape[1:]
    assert st.page_size == sep.page_size == 3
    np.testing.assert_array_equal(st.k_cache[:, 0], sep.k_cache)  # NaN where NaN
    np.testing.assert_array_equal(st.k_cache[:, 1], sep.v_cache)
    assert not np.array_equal(st.k_cache[:, 0], st.k_cache[:, 1], equal_nan=True)
    new = np.ones((3, 1, 2, 8))  # (B, n, Hkv, E)
    lens = sep.cache_seqlens - 1
    kv, none = Fm.appended(st.k_cache, None, st.block_table, lens, new, 2 * new, f"stacked-{base}")
    k, v = Fm.appended(sep.k_cache, sep.v_cache, sep.block_table, lens, new, 2 * new, base)
    assert none is None
    np.testing.assert_array_equal(kv[:, 0], k)
    np.testing.assert_array_equal(kv[:, 1], v)


def test_a_stacked_layout_needs_equal_head_dims():
    with pytest.raises(ValueError, match="layout stacked-NHD holds K and V in one tensor: it needs Ev == E; got E=8, "
                                         "Ev=6"):
        Fm.to_paged(_problem(), 4, "stacked-NHD")


def test_a_problem_without_a_packed_form_says_why():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 1, 3, 2))
    k = rng.standard_normal((2, 1, 4, 2))
    with pytest.raises(ValueError, match="a mask has no packed"):
        Fm.to_packed(validate(q, k, k, mask=np.ones((3, 4), dtype=bool)))
    with pytest.raises(ValueError, match="global positions differ"):
        Fm.to_packed(validate(q, k, k, is_causal=True, causal_alignment="bottom_right", kv_lengths=np.array([4, 2])))
    assert Fm.to_packed(validate(q, k, k, kv_lengths=np.array([4, 2]))).cu_seqlens_k.tolist() == [0, 4, 6]


def _packed_args():
    q, k = np.zeros((5, 2, 4)), np.zeros((6, 1, 4))
    return dict(q=q, k=k, v=k, cu_seqlens_q=np.array([0, 2, 5], np.int32), cu_seqlens_k=np.array([0, 3, 6], np.int32),
                max_seqlen_q=3, max_seqlen_k=3, seqused_k=np.array([3, 2], np.int32))


@pytest.mark.parametrize("change, message", [
    (dict(cu_seqlens_q=np.array([0, 3, 2], np.int32)), "cu_seqlens_q must start at >= 0 and never decrease"),
    (dict(cu_seqlens_k=np.array([0, 3, 7], np.int32)), r"cu_seqlens_k\[-1\]=7 lies beyond the tensor's 6 tokens"),
    (dict(seqused_k=np.array([4, 2], np.int32)), "seqused_k must be"),
    (dict(cu_seqlens_k=np.array([0.0, 3, 6])), "cu_seqlens_k must be an integer array"),
    (dict(cu_seqlens_k=np.array([0, 6], np.int32)), "cu_seqlens_k must be"),
    (dict(max_seqlen_q=2), "max_seqlen_q must be an int >= the longest sequence"),
    (dict(k=np.zeros((6, 4, 4)), v=np.zeros((6, 4, 4))), "multiple of k.s Hkv"),
])
def test_bad_packed_input_names_the_argument(change, message):
    with pytest.raises(ValueError, match=message):
        Fm.validate_packed(**{**_packed_args(), **change})


def _paged_args():
    kc = np.zeros((4, 2, 1, 3))  # (num_pages, P, Hkv, E)
    return dict(k_cache=kc, v_cache=kc, block_table=np.array([[0, 1], [2, 3]], np.int32),
                cache_seqlens=np.array([3, 4], np.int32), cache_leftpad=np.array([1, 0], np.int32))


@pytest.mark.parametrize("change, message", [
    (dict(block_table=np.array([[0, 4], [2, 3]], np.int32)), r"page id outside the pool \[0, 4\): \[4\]"),
    (dict(block_table=np.array([[0, -1], [2, 3]], np.int32)), "page id outside the pool"),
    (dict(cache_seqlens=np.array([5, 4], np.int32)), "block_table of 2 pages of 2 is too short for cache_seqlens"),
    (dict(cache_leftpad=np.array([4, 0], np.int32)), "cache_leftpad must be"),
    (dict(v_cache=np.zeros((4, 3, 1, 3))), "must share"),
    (dict(layout="BHSD"), "layout must be one of"),
    # stacked: one (num_pages, 2, P, Hkv, E) tensor as k_cache, no v_cache
    (dict(layout="stacked-NHD"), "v_cache must be None in layout stacked-NHD"),
    (dict(layout="stacked-NHD", v_cache=None), r"k_cache must be shaped \(num_pages, 2, page_size, Hkv, E\)"),
    (dict(layout="stacked-HND", v_cache=None, k_cache=np.zeros((4, 3, 1, 2, 3))),
     r"k_cache's axis 1 must be 2 \(0: K, 1: V\) in layout stacked-HND; got shape \(4, 3, 1, 2, 3\)"),
    (dict(layout="stacked-NHD", v_cache=None, k_cache=np.zeros((4, 2, 2, 1, 3)),
          block_table=np.array([[0, 1], [2, 4]], np.int32)), r"page id outside the pool \[0, 4\): \[4\]"),
])
def test_bad_paged_input_names_the_argument(change, message):
    with pytest.raises(ValueError, match=message):
        Fm.validate_paged(**{**_paged_args(), **change})


def test_a_stacked_cache_validates():
    args = {**_paged_args(), "k_cache": np.zeros((4, 2, 1, 2, 3)), "v_cache": None, "layout": "stacked-HND"}
    assert Fm.validate_paged(**args) == 2  # (num_pages, 2, Hkv, P, E): pages of 2
    args["cache_seqlens"] = np.array([5, 4], np.int32)
    with pytest.raises(ValueError, match="block_table of 2 pages of 2 is too short"):
        Fm.validate_paged(**args)


def test_an_unread_table_column_may_hold_anything():
    args = _paged_args()
    args["block_table"] = np.array([[0, 1], [2, 99]], np.int32)
    args["cache_seqlens"] = np.array([3, 2], np.int32)  # sequence 1 reads one page: column 1 is never read
    assert Fm.validate_paged(**args) == 2
