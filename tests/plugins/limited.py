"""A plain function whose kernel takes head dims up to 128 only (a Triton kernel's typical limit), declared."""
from __future__ import annotations

from attnspec.backends.plain import declare
from attnspec.specs import reference


@declare(max_head_dim=128, dtypes=("float32",))
def attention(query, key, value, attn_mask=None, is_causal=False, scale=None):
    assert query.shape[-1] <= 128 and value.shape[-1] <= 128, "called outside its declared limits"
    return reference.attention(query, key, value, attn_mask, is_causal, scale).astype(query.dtype)
