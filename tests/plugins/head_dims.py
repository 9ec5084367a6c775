"""A backend that takes head dims in multiples of 8 only (cuDNN's fused attention does), declared
as such: the suite must draw problems it takes and still judge every property on them."""
from __future__ import annotations

from dataclasses import replace

from attnspec.backends import declare
from attnspec.backends.numpy_backends import NumpyNaive


class NumpyHeadDim8(NumpyNaive):
    name = "numpy-head-dim-8"
    capabilities = replace(NumpyNaive.capabilities, head_dim_multiple=8)  # numpy-naive's, and the multiple

    def native_attention(self, q, k, v, call):
        if q.shape[-1] % 8 or v.shape[-1] % 8:  # what a kernel without the base's check would hit
            raise RuntimeError(f"head dim must be a multiple of 8, got E={q.shape[-1]}, Ev={v.shape[-1]}")
        return super().native_attention(q, k, v, call)


@declare(dtypes=("float64", "float32"), fully_masked="zeros", causal_alignment="top_left", head_dim_multiple=8,
         deviations={"zero_future_mass": "said to leak weight to the future (declared to test the plumbing)"})
def plain_head_dim_8(query, key, value, attn_mask=None, is_causal=False, scale=None):
    """A plain function that takes head dims in multiples of 8 only."""
    if query.shape[-1] % 8 or value.shape[-1] % 8:
        raise RuntimeError(f"head dim must be a multiple of 8, got E={query.shape[-1]}, Ev={value.shape[-1]}")
    return _NAIVE.forward(query, key, value, attn_mask, is_causal, scale, dtype=str(query.dtype))


_NAIVE = NumpyNaive()
