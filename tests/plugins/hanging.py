"""A backend whose every call hangs (a kernel that never returns): the suite must learn it once.

`attention` sleeps far past any per-call limit the tests set (ATTNSPEC_CALL_TIMEOUT); its thread is
a daemon, so the run still ends."""
from __future__ import annotations

import time


def attention(query, key, value, attn_mask=None, is_causal=False, scale=None):
    time.sleep(3600)
