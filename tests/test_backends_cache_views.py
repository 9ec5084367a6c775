"""Paged caches as strided views of larger storage (backends/cache_views.py): the values of the contiguous
caches, storage the view does not cover, a declaration that keeps them from a kernel, and a planted kernel
that reads with dense strides caught by them only."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from attnspec.backends import serving
from attnspec.backends.base import BackendFailure, Unsupported
from attnspec.backends.cache_views import CACHE_VIEWS, PADDING, native_views, views_for, written_outside
from attnspec.backends.numpy_backends import NumpyNaive
from attnspec.specs import error_budget
from attnspec.specs import formats as Fm
from tests.broken.serving_edge_bugs import PagedDenseCacheStrides, at_dense_strides


def _caches(layout: str, Ev: int = 8):
    rng = np.random.default_rng(5)
    stacked, base = Fm.split_layout(layout)
    shape = (6,) + ((2,) if stacked else ()) + ((4, 3) if base == "NHD" else (3, 4))  # (pages, [2,] P|Hkv, Hkv|P)
    k = rng.standard_normal(shape + (8,))  # (..., E)
    v = None if stacked else rng.standard_normal(shape + (Ev,))  # (..., Ev)
    return k, v


@pytest.mark.parametrize("layout", Fm.PAGED_LAYOUTS)
def test_each_view_holds_the_contiguous_values_in_other_strides(layout):
    k, v = _caches(layout)
    backend = NumpyNaive()
    for view in views_for(layout, 4, 3, 8, 8):
        got, uncovered = native_views(backend, "float64", k, v, layout, view)
        assert bool(uncovered) == (view in ("wider_rows", "padded_pages"))  # the others cover all their storage
        for was, now in zip((k, v), got, strict=True):
            if was is None:
                assert now is None
                continue
            assert np.array_equal(now, was), view
            assert not now.flags.c_contiguous, f"{view} is contiguous: it would test nothing"
            assert now.base is not None and now.base.size > now.size or view == "transposed_storage", view


def test_views_that_cannot_hold_the_caches_or_would_be_contiguous_are_left_out_and_refused_by_name():
    assert set(views_for("HND", 4, 3, 8, 8)) == set(CACHE_VIEWS)
    assert "pool_halves" not in views_for("NHD", 4, 3, 8, 6)  # halves of one pool share the head dim
    assert "pool_halves" not in views_for("stacked-HND", 4, 3, 8, 8)  # already one pool
    for P, Hkv in ((1, 3), (4, 1)):  # transposing a size-1 axis changes no stride
        assert "transposed_storage" not in views_for("NHD", P, Hkv, 8, 8)
    k, v = _caches("NHD", Ev=6)
    with pytest.raises(ValueError, match="cache_view"):
        native_views(NumpyNaive(), "float64", k, v, "NHD", "pool_halves")
    with pytest.raises(ValueError, match="cache_view"):
        native_views(NumpyNaive(), "float64", k, v, "NHD", "diagonal")
    with pytest.raises(ValueError, match="cache_view"):
        native_views(NumpyNaive(), "float64", k[:, :1], v[:, :1], "NHD", "transposed_storage")  # pages of one slot


def test_wider_rows_put_k_and_v_at_other_storage_offsets_with_nan_around():
    k, v = _caches("NHD")
    (kv, vv), uncovered = native_views(NumpyNaive(), "float64", k, v, "NHD", "wider_rows")
    assert np.isnan(kv.base[..., 8:]).all() and np.isnan(vv.base[..., :PADDING]).all()
    assert [(name, storage is view.base) for (name, storage, _), view in zip(uncovered, (kv, vv), strict=True)] == [
        ("k_cache", True), ("v_cache", True)]
    assert kv.strides == vv.strides and kv.strides[-2] == (8 + PADDING) * 8


def test_padded_pages_have_a_page_stride_of_no_whole_number_of_slots_and_nan_after_each_page():
    k, v = _caches("NHD")  # (6, 4, 3, 8): a page 96 elements, a slot 24
    (kv, vv), uncovered = native_views(NumpyNaive(), "float64", k, v, "NHD", "padded_pages")
    assert kv.strides[0] == (96 + PADDING) * 8 and kv.strides[0] % kv.strides[1] != 0 and kv.strides[1:] == k.strides[1:]
    assert all(np.isnan(storage[at]).all() and storage[at].shape == (6, PADDING) for _, storage, at in uncovered)


@pytest.mark.parametrize("layout", ["NHD", "stacked-HND"])
def test_torch_is_handed_views_of_one_storage_not_copies(layout):
    torch = pytest.importorskip("torch")
    from attnspec.backends.torch_backends import TorchMath
    k, v, backend = *_caches(layout), TorchMath()
    backend.load()
    for view in views_for(layout, 4, 3, 8, 8):
        got, uncovered = native_views(backend, "float32", k, v, layout, view)
        for was, now in zip((k, v), got, strict=True):
            if was is None:
                continue
            assert isinstance(now, torch.Tensor) and not now.is_contiguous(), view
            assert np.array_equal(now.numpy(), was.astype(np.float32)), view
            assert now.untyped_storage().nbytes() > now.numel() * now.element_size() or view == "transposed_storage"
        for name, storage, _ in uncovered:  # each cache's uncovered part is in the storage its view is cut from
            now = got[("k_cache", "v_cache").index(name)]
            assert now.untyped_storage().data_ptr() == storage.untyped_storage().data_ptr(), (view, name)


def _decode():
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((2, 2, 1, 8)), rng.standard_normal((2, 2, 9, 8)), rng.standard_normal((2, 2, 9, 8))
    return q, k, v, dict(positions="per_sequence", kv_lengths=np.array([9, 6]))


@pytest.mark.parametrize("view", CACHE_VIEWS)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_a_correct_kernel_agrees_on_views_and_a_dense_stride_read_does_not(view, layout):
    q, k, v, fields = _decode()
    kw = dict(page_size=4, layout=layout, rng=3, cache_view=view, **fields)
    right = serving.forward_paged(NumpyNaive(), q, k, v, **kw)  # (B, H, 1, Ev)
    assert error_budget.check_forward(right, q, k, v, dtype="float64", **fields)
    wrong = serving.forward_paged(PagedDenseCacheStrides(), q, k, v, dtype="float32", **kw)
    assert not error_budget.check_forward(wrong, q, k, v, dtype="float32", **fields)
    plain = serving.forward_paged(PagedDenseCacheStrides(), q, k, v, dtype="float32", page_size=4, layout=layout,
                                  rng=3, **fields)  # contiguous caches: the planted kernel is right
    assert error_budget.check_forward(plain, q, k, v, dtype="float32", **fields)


def test_a_backend_declaring_contiguous_caches_is_never_handed_a_view():
    class Contiguous(NumpyNaive):
        name = "contiguous-caches"
        capabilities = replace(NumpyNaive.capabilities, paged_cache_views=False)

        def native_paged(self, q, k_cache, v_cache, args, call):
            assert k_cache.flags.c_contiguous and v_cache.flags.c_contiguous
            return super().native_paged(q, k_cache, v_cache, args, call)

    q, k, v, fields = _decode()
    with pytest.raises(Unsupported, match="paged_cache_views"):
        serving.forward_paged(Contiguous(), q, k, v, cache_view="pool_halves", **fields)
    serving.forward_paged(Contiguous(), q, k, v, **fields)
    assert Contiguous().describe()["paged_cache_views"] == ()


def test_a_backend_declaring_some_views_is_handed_those_only():
    class NoPaddedPages(NumpyNaive):  # checks its page stride is a whole number of slots
        name = "no-padded-pages"
        capabilities = replace(NumpyNaive.capabilities, paged_cache_views=("pool_halves", "wider_rows"))

    q, k, v, fields = _decode()
    assert NoPaddedPages().capabilities.paged_cache_views == ("pool_halves", "wider_rows")
    with pytest.raises(Unsupported, match="takes no padded_pages views .*paged_cache_views: pool_halves, wider_rows"):
        serving.forward_paged(NoPaddedPages(), q, k, v, cache_view="padded_pages", **fields)
    serving.forward_paged(NoPaddedPages(), q, k, v, cache_view="wider_rows", **fields)
    for bad in ("wider_rows", ("diagonal",)):
        with pytest.raises(ValueError, match="Capabilities.paged_cache_views: True, False or a tuple of"):
            replace(NumpyNaive.capabilities, paged_cache_views=bad)


def test_a_kernel_refusing_a_view_undeclared_fails_saying_what_to_declare():
    class Refuses(NumpyNaive):
        name = "refuses-views"

        def native_paged(self, q, k_cache, v_cache, args, call):
            if not k_cache.flags.c_contiguous:
                raise RuntimeError("k_cache must be contiguous")
            return super().native_paged(q, k_cache, v_cache, args, call)

    q, k, v, fields = _decode()
    with pytest.raises(BackendFailure, match=r"raised RuntimeError: k_cache must be contiguous .*paged_cache_views=False"):
        serving.forward_paged(Refuses(), q, k, v, cache_view="wider_rows", **fields)


def test_declare_carries_paged_cache_views_to_a_kvcache_function():
    from attnspec.backends.flash_functions import FlashFunctionBackend
    from attnspec.backends.plain import declare
    from tests.broken import flash_twins

    def flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, softmax_scale=None,
                                causal=False):
        return flash_twins.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                                   block_table=block_table, softmax_scale=softmax_scale, causal=causal)

    assert FlashFunctionBackend(flash_attn_with_kvcache, "kv").capabilities.paged_cache_views == CACHE_VIEWS
    declare(flash_attn_with_kvcache, paged_cache_views=("padded_pages", "wider_rows"))
    assert FlashFunctionBackend(flash_attn_with_kvcache, "kv").capabilities.paged_cache_views == (
        "wider_rows", "padded_pages")  # CACHE_VIEWS' order
    declare(flash_attn_with_kvcache, paged_cache_views=False)
    assert FlashFunctionBackend(flash_attn_with_kvcache, "kv").capabilities.paged_cache_views == ()


class _DenseStrideWriter(NumpyNaive):
    """An append kernel that writes (and reads) its caches at a dense tensor's strides."""

    name = "dense-stride-writer"

    def native_paged_append(self, q, k_cache, v_cache, k_new, v_new, args, call):
        # a view, not a copy: the writes land in the caches' memory at the wrong places
        return super().native_paged_append(q, at_dense_strides(k_cache), at_dense_strides(v_cache), k_new, v_new,
                                           args, call)


@pytest.mark.parametrize("view", CACHE_VIEWS)
def test_an_append_through_views_is_the_reference_update_and_a_dense_stride_writer_is_not(view):
    q, k, v, fields = _decode()
    kw = dict(page_size=4, layout="NHD", rng=3, cache_view=view, **fields)
    _, stored, want = serving.append_paged(NumpyNaive(), q, k, v, 1, **kw)
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(stored, want, strict=True)), view
    try:  # caught either way: a slot written elsewhere, or a write into the padding (which placement decides)
        _, stored, want = serving.append_paged(_DenseStrideWriter(), q, k, v, 1, **kw)
    except BackendFailure as e:
        assert view in ("wider_rows", "padded_pages") and "paged append wrote outside" in str(e), (view, str(e))
        return
    assert not all(np.array_equal(a, b, equal_nan=True) for a, b in zip(stored, want, strict=True)), view


def _past_each_k_row(k_cache: np.ndarray) -> np.ndarray:
    """The element after each K row: a vector store one element too wide.  Only where the rows sit inside
    wider ones (a row end inside the storage), or this test would write past a buffer's end."""
    assert k_cache.strides[-2] > k_cache.shape[-1] * k_cache.itemsize, "no gap after the rows"
    wider = np.lib.stride_tricks.as_strided(k_cache, k_cache.shape[:-1] + (k_cache.shape[-1] + 1,), k_cache.strides)
    return wider[..., -1]  # (..., ) a view: writes land in the gap


class _OverrunningAppend(NumpyNaive):
    """Appends right, then stores one element past each K row (the view itself stays right)."""

    name = "overrunning-append"

    def native_paged_append(self, q, k_cache, v_cache, k_new, v_new, args, call):
        out = super().native_paged_append(q, k_cache, v_cache, k_new, v_new, args, call)
        _past_each_k_row(k_cache)[...] = 0.0
        return out


class _ScratchInTheGaps(NumpyNaive):
    """A forward that keeps scratch just past its K rows, and answers right."""

    name = "scratch-in-the-gaps"

    def native_paged(self, q, k_cache, v_cache, args, call):
        _past_each_k_row(k_cache)[...] = 1.0
        return super().native_paged(q, k_cache, v_cache, args, call)


def test_a_write_around_a_view_fails_though_the_view_holds_the_right_values():
    q, k, v, fields = _decode()
    kw = dict(page_size=4, layout="NHD", rng=3, cache_view="wider_rows", **fields)
    with pytest.raises(BackendFailure, match="paged append wrote outside k_cache: into the storage around its "
                                             "wider_rows view"):
        serving.append_paged(_OverrunningAppend(), q, k, v, 1, **kw)
    with pytest.raises(BackendFailure, match="paged forward wrote outside k_cache"):
        serving.forward_paged(_ScratchInTheGaps(), q, k, v, **kw)


@pytest.mark.parametrize("view", ["wider_rows", "padded_pages"])
def test_a_write_into_the_storage_around_a_view_is_seen_though_the_view_holds_the_right_values(view):
    k, v = _caches("NHD")
    (kv, vv), uncovered = native_views(NumpyNaive(), "float64", k, v, "NHD", view)
    assert written_outside(NumpyNaive(), uncovered) == ""
    if view == "wider_rows":  # one element past each K row: the gap after it
        _past_each_k_row(kv)[...] = 0.0
    else:  # one element past V's last page, read as a dense page: the padding after it
        page = vv[-1]  # (P, Hkv, Ev), dense inside
        np.lib.stride_tricks.as_strided(page, (page.size + 1,), (page.itemsize,))[-1] = 0.0
    assert np.array_equal(kv, k) and np.array_equal(vv, v)
    assert written_outside(NumpyNaive(), uncovered) == ("k_cache" if view == "wider_rows" else "v_cache")
