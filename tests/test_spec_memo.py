"""The budget functions' memo (specs/memo.py) answers only for the same content, and what it shares is read-only."""
import numpy as np
import pytest

from attnspec.specs import error_budget as eb
from attnspec.specs.memo import ENTRY_BYTES, ContentMemo, Unkeyable, content_key
from tests._helpers import qkv


def test_key_tells_apart_what_the_arithmetic_tells_apart():
    a = np.array([0.0, 1.0])
    assert content_key(a) == content_key(a.copy())
    assert content_key(a) != content_key(np.array([-0.0, 1.0]))  # a signed zero reaches -inf through 1/x
    assert content_key(a) != content_key(a.astype(np.float32))  # same values, another dtype
    assert content_key(a) != content_key(a.reshape(2, 1))  # same bytes, another shape
    assert content_key(np.array([np.nan])) == content_key(np.array([np.nan]))  # the same NaN is the same input
    assert content_key(0.0) != content_key(-0.0) and content_key(1) != content_key(1.0) != content_key(True)
    assert content_key({"window": (3, 0)}) != content_key({"window": (0, 3)})
    assert content_key(np.arange(6)[::2]) == content_key(np.array([0, 2, 4]))  # a view keys by what it holds


def test_key_tells_apart_formats_that_share_a_dtype_string():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    raw = np.arange(8, dtype=np.uint8)
    fn, fnuz = raw.view(ml_dtypes.float8_e4m3fn), raw.view(ml_dtypes.float8_e4m3fnuz)
    assert fn.dtype.str == fnuz.dtype.str  # both '<V1': the string alone would give one key to two problems
    assert content_key(fn) != content_key(fnuz)


def test_unkeyable_values_are_computed_every_time():
    memo, calls = ContentMemo(1 << 20), []
    with pytest.raises(Unkeyable):
        content_key(object())
    with pytest.raises(Unkeyable):
        content_key(np.ma.masked_array([1.0, 2.0], mask=[False, True]))  # a subclass reads more than its bytes
    for _ in range(2):
        memo(lambda: calls.append(1) or np.zeros(2), np.array([object()], dtype=object))
    assert len(calls) == 2 and memo.hits == 0


def test_a_hit_is_shared_read_only_and_the_oldest_is_dropped_past_the_bound():
    memo, calls = ContentMemo(max_bytes=2 * (80 + ENTRY_BYTES)), []

    def compute(n):
        calls.append(n)
        return [np.full(10, float(n))]  # 80 bytes, and a list

    first = memo(lambda: compute(1), 1)
    assert memo(lambda: compute(1), 1) is first and calls == [1]
    assert isinstance(first, tuple)  # a list would let one caller drop an entry under the next one's feet
    with pytest.raises(ValueError):
        first[0][0] = 5.0  # a caller writing into a shared result fails, never corrupts the next caller's
    memo(lambda: compute(2), 2)
    memo(lambda: compute(3), 3)  # 240 bytes held would pass the bound: 1, the least recent, goes
    memo(lambda: compute(1), 1)
    assert calls == [1, 2, 3, 1] and memo.held <= memo.max_bytes


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_memoised_budget_equals_a_fresh_one_and_misses_on_one_changed_entry(dtype):
    q, k, v = qkv(seed=3, batch=(1, 2), Lq=5, Lk=7, E=4)
    mask = np.random.default_rng(1).random((5, 7)) < 0.7  # (Lq, Lk)
    mask[:, 0] = True
    fresh = eb._forward_rows(eb._problem(q, k, v, mask, False, None, {}), dtype, "attnspec")
    got = eb.forward_allowed_rows(q, k, v, mask, dtype=dtype)
    again = eb.forward_allowed_rows(q.copy(), k.copy(), v.copy(), mask.copy(), dtype=dtype)
    assert all(a is b for a, b in zip(got, again, strict=True))  # the second call is the memo's
    for a, b in zip(got, fresh, strict=True):
        np.testing.assert_array_equal(a, b)
    k2 = k.copy()
    k2[0, 1, 6, 3] = np.nextafter(k2[0, 1, 6, 3], np.inf)  # one ulp in one key: another problem, computed afresh
    misses = eb._MEMO.misses
    moved = eb.forward_allowed_rows(q, k2, v, mask, dtype=dtype)
    assert eb._MEMO.misses == misses + 1 and moved[0] is not got[0]
