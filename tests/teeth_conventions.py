"""The proof of teeth's witnesses for the conventions of issue 31 (tests/broken/witnesses.py's ops
"merge", "knobs", "repeat_backward", "batch", and the empty-row LSE; issue 30's "bad_index") and for
its format calls (op "paged": the forward through `backends.serving.forward_paged`, its LSE too where the
witness asks `return_lse`, its caches as the views the witness names in `cache_view`, at the witness's
`knobs`; op "packed":
`forward_packed`, in the witness's `layout`): verdicts of one backend on one witness in one dtype, as
tests/test_teeth.py's `_verdicts` returns them.  A backend that does not offer what a witness asks (no
merge, no such knob, no gradients, no declaration to hold it to) declines it with Unsupported.
"""
from __future__ import annotations

import numpy as np

from attnspec.backends.base import Unsupported
from attnspec.specs import error_budget, reference
from attnspec.specs.invariants import Verdict
from attnspec.specs.merge_budget import merge_allowed

CONVENTION_OPS = ("merge", "knobs", "repeat_backward", "batch", "paged", "packed", "bad_index", "empty_sizes")
PAGE_SIZE = 2  # the paged witness's pages: several a sequence


def _fp8_budget(backend, dtype: str) -> str:
    """What judges a format call's results: dtype, or at fp8 inputs the backend's declared computation."""
    from attnspec.properties.target import Session, Target
    from attnspec.specs.fp8 import is_fp8
    return Target(Session(backend, backend.name), dtype).budget_dtype if is_fp8(dtype) else dtype


def bad_index_verdicts(backend, dtype: str) -> list:
    """Each bad input of the formats it takes refused, where rejects_bad_indices is declared."""
    from attnspec.backends.bad_indices import BAD_INPUTS, probe
    if not backend.semantics.rejects_bad_indices:
        raise Unsupported(f"{backend.name} declares no refusal of bad index arguments")
    out = []
    for kind in BAD_INPUTS:
        try:
            observed, detail = probe(backend, kind, dtype)
        except Unsupported:
            continue  # not a format it takes
        out.append(Verdict(f"bad_index_{kind}", observed.startswith("refused"), None, float("nan"),
                           f"{kind}: {observed} ({detail}) where rejects_bad_indices is declared"))
    return out


def _bitwise(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


def empty_lse_verdict(backend, lse, empty) -> Verdict:
    """Rows that see nothing hold the declared empty_lse (undeclared: whatever they hold)."""
    declared = backend.semantics.empty_lse
    want = {"-inf": -np.inf, "+inf": np.inf}.get(declared)
    rows = np.asarray(lse)[np.broadcast_to(empty, np.shape(lse))]
    ok = want is None or bool(np.all(rows == want))
    return Verdict("empty_lse", ok, None, float("nan"), f"empty rows' LSE {rows[:4]} where {declared} is declared")


def verdicts(backend, p: dict, dtype: str) -> list:
    q, k, v, mask, causal, scale, fields = (p[n] for n in ("q", "k", "v", "mask", "is_causal", "scale", "fields"))
    kw = dict(mask=mask, is_causal=causal, scale=scale, dtype=dtype, **fields)
    if p["op"] == "bad_index":
        return bad_index_verdicts(backend, dtype)
    if p["op"] == "merge":  # two states or more: a list merge's witness is declined by a pair-only merge
        parts = [(np.asarray(error_budget.round_to(o, dtype), dtype=np.float64), lse) for o, lse in p["states"]]
        plus = backend.semantics.empty_lse == "+inf"  # the states in its declared convention
        given = [(o, np.where(lse == -np.inf, np.inf, lse) if plus else lse) for o, lse in parts]
        o, lse = backend.merge(given, dtype, as_list=len(parts) != 2, layout=p.get("layout", "contiguous"))
        lse = np.where(lse == (np.inf if plus else -np.inf), -np.inf, lse)
        want_o, want_lse = reference.merge(parts)
        o_tol, l_tol = merge_allowed(parts, dtype)
        empty = np.isneginf(want_lse)
        with np.errstate(invalid="ignore"):
            ok_o = bool(np.all(np.where(empty[..., None], o == 0, np.abs(o - want_o) <= o_tol)))
            ok_l = bool(np.all(np.where(empty, lse == -np.inf, np.abs(lse - want_lse) <= l_tol)))
        return [Verdict("merge", ok_o and ok_l, None, float("nan"), f"merged {o[0, 0]} / lse {lse[0, 0]}; "
                        f"reference {want_o[0, 0]} / {want_lse[0, 0]}")]
    if p["op"] in ("paged", "packed"):  # a backend without the format (or the witness's knob) declines
        from attnspec.backends import serving
        if set(p.get("knobs") or ()) - set(backend.knobs):
            raise Unsupported(f"{backend.name} has no knob {sorted(p['knobs'])}")
        lse = p.get("return_lse", False)
        y = (serving.forward_paged(backend, q, k, v, page_size=p.get("page_size", PAGE_SIZE), rng=0, return_lse=lse,
                                   cache_view=p.get("cache_view", ""), knobs=p.get("knobs"), **kw)
             if p["op"] == "paged" else serving.forward_packed(backend, q, k, v, rng=0, return_lse=lse,
                                                               layout=p.get("layout", "contiguous"), **kw))
        out, lse = y if lse else (y, None)
        budget = _fp8_budget(backend, dtype)
        out_verdict = error_budget.check_forward(out, q, k, v, mask, causal, scale, budget, **fields)
        if lse is None:
            return [out_verdict]
        return [out_verdict, error_budget.check_lse(lse, q, k, v, mask, causal, scale, budget, **fields)]
    if p["op"] == "knobs":
        if set(p["knobs"]) - set(backend.knobs):
            raise Unsupported(f"{backend.name} has no knob {sorted(p['knobs'])}")
        if backend.semantics.knob_exact:  # declared: bitwise the default's output
            out, default = backend.forward(q, k, v, knobs=p["knobs"], **kw), backend.forward(q, k, v, **kw)
            return [error_budget.check_forward(out, q, k, v, mask, causal, scale, dtype, **fields),
                    Verdict("knob_exact", _bitwise(out, default), None, float("nan"),
                            f"knobs {p['knobs']} change the output's bits, knob_exact declared")]
        if not p.get("return_lse"):
            out = backend.forward(q, k, v, knobs=p["knobs"], **kw)
            return [error_budget.check_forward(out, q, k, v, mask, causal, scale, dtype, **fields)]
        if not backend.supports("lse"):
            raise Unsupported(f"{backend.name} returns no LSE")
        out, lse = backend.forward(q, k, v, knobs=p["knobs"], return_lse=True, **kw)
        return [error_budget.check_forward(out, q, k, v, mask, causal, scale, dtype, **fields),
                error_budget.check_lse(lse, q, k, v, mask, causal, scale, dtype, **fields)]
    if p["op"] == "empty_sizes":  # the output of an empty launch in the dtype of a call with rows
        _, usual = backend.forward_as_returned(q, k, v, **kw)
        found = {"Lq=0": backend.forward_as_returned(q[..., :0, :], k, v, **kw)[1],
                 "Lk=0": backend.forward_as_returned(q, k[..., :0, :], v[..., :0, :], **kw)[1]}
        return [Verdict("empty_sizes", all(d == usual for d in found.values()), None, float("nan"),
                        f"empty launches return {found}, a call with rows {usual}")]
    if p["op"] == "repeat_backward":
        if not backend.semantics.deterministic:
            raise Unsupported(f"{backend.name} declares no deterministic backward")
        runs = [backend.backward(q, k, v, p["grad_out"], **kw) for _ in range(4)]
        same = all(_bitwise(a, b) for r in runs[1:] for a, b in zip(runs[0], r, strict=True))
        return [Verdict("repeat_backward", same, None, float("nan"), "repeated backward calls differ")]
    if not backend.semantics.batch_invariant:  # "batch"
        raise Unsupported(f"{backend.name} declares no batch invariance")
    whole = backend.forward(q, k, v, **kw)  # (B, H, Lq, Ev)
    same = all(_bitwise(backend.forward(q[b:b + 1], k[b:b + 1], v[b:b + 1], **kw)[0], whole[b])
               for b in range(q.shape[0]))
    return [Verdict("batch", same, None, float("nan"), "a sequence's rows differ alone and in the batch")]
