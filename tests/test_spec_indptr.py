"""FlashInfer's CSR page arrays from flash-attention's block tables (specs/indptr.py)."""
import numpy as np
import pytest

from attnspec.specs import formats as Fm
from attnspec.specs.indptr import block_table_of, paged_indptr, validate_indptr
from attnspec.specs.problem import validate


def test_hand_computed_pages_and_last_page_lengths():
    table = np.array([[7, 2, 9], [4, 0, 0], [5, 6, 1], [3, 3, 3]], np.int32)  # (B, max_pages)
    lens = np.array([9, 4, 0, 1], np.int32)  # page size 4: 3 pages (last 1), 1 full page, none, 1 page (last 1)
    indptr, indices, last = paged_indptr(table, lens, 4)
    assert indptr.tolist() == [0, 3, 4, 4, 5]
    assert indices.tolist() == [7, 2, 9, 4, 3]
    assert last.tolist() == [1, 4, 0, 1]
    assert all(x.dtype == np.int32 for x in (indptr, indices, last))


@pytest.mark.parametrize("page_size", [1, 2, 3, 5, 16])
def test_kv_len_formula_inverts_cache_seqlens(page_size):
    rng = np.random.default_rng(page_size)
    lens = np.array([0, 1, page_size, page_size + 1, 3 * page_size, 7], np.int32)
    table = rng.integers(0, 50, size=(lens.size, 8)).astype(np.int32)
    indptr, indices, last = paged_indptr(table, lens, page_size)
    counts = np.diff(indptr)
    assert (last[lens > 0] >= 1).all() and (last <= page_size).all()
    kv_len = np.where(counts > 0, page_size * (counts - 1) + last, 0)  # FlashInfer's kv_len
    assert kv_len.tolist() == lens.tolist()
    back, back_lens = block_table_of(indptr, indices, last, page_size, 50)
    assert back_lens.tolist() == lens.tolist()
    for b in range(lens.size):  # every page a sequence reads, in order
        assert back[b, :counts[b]].tolist() == table[b, :counts[b]].tolist()


def test_the_harness_paged_form_converts():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 2, 4, 8)), rng.standard_normal((3, 2, 11, 8)), rng.standard_normal((3, 2, 11, 8))
    p = validate(q, k, v, kv_lengths=np.array([11, 5, 8]), positions="per_sequence")
    pg = Fm.to_paged(p, 4, rng=1)
    indptr, indices, last = paged_indptr(pg.block_table, pg.cache_seqlens, pg.page_size)
    assert validate_indptr(indptr, indices, last, 4, pg.k_cache.shape[0]).tolist() == [11, 5, 8]
    assert last.tolist() == [3, 1, 4]


@pytest.mark.parametrize("bad, match", [
    (dict(last=[5, 1]), "paged_kv_last_page_len must be in \\[1, page_size=4\\]"),  # flashinfer#320
    (dict(last=[0, 1]), "paged_kv_last_page_len"),
    (dict(indptr=[0, 3, 2]), "paged_kv_indptr"),
    (dict(indices=[0, 1, 99]), "outside the pool"),
    (dict(indptr=[0, 2, 3], last=[4, 1.5]), "paged_kv_last_page_len must be a 1-d integer"),
])
def test_bad_csr_pages_are_refused_by_name(bad, match):
    args = dict(indptr=[0, 2, 3], indices=[0, 1, 2], last=[4, 1])
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        validate_indptr(np.array(args["indptr"]), np.array(args["indices"]), np.array(args["last"]), 4, 10)


def test_a_table_too_short_is_refused():
    with pytest.raises(ValueError, match="block_table of 1 pages of 4 is too short"):
        paged_indptr(np.zeros((1, 1), np.int32), np.array([5], np.int32), 4)
