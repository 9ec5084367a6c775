"""The declared conventions per backend (issue 31), each beside what the suite observed of it.

A backend's declarations (`Backend.conventions`, recorded by the suite once per backend) say what it does
where the spec leaves a choice or kernels differ: an empty row's output and LSE, the LSE's base and
whether it counts the sinks, determinism, batch invariance, its tuning knobs, the merge it offers.  The
suite observes each through a semantics question (`lse_base`, `empty_lse`, ...) or the properties of a
family (the knobs', the merge's); this module joins the two: one row per backend and convention, with
the declaration, the observation and whether they agree (None: nothing declared, or nothing observed).
"""
from __future__ import annotations

import pandas as pd

from attnspec.reports.verdicts import text, tri

DTYPE_SHORT = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64", "float8_e4m3fn": "e4m3",
               "float8_e5m2": "e5m2"}
_BAD_INDICES = ("cu_seqlens_decreasing", "cu_seqlens_past_tokens", "seqused_k_over_sequence", "cu_seqlens_q_decreasing",
                "max_seqlen_q_short", "page_id_past_pool", "page_id_negative", "table_too_short")
# (backends/bad_indices.BAD_INPUTS, which reports may not import: tests check they agree)
COLUMNS = ("backend", "convention", "declared", "observed", "agrees", "source")

# convention -> where the suite observes it: ("semantics", questions) or ("conformance", property-name prefixes)
CONVENTIONS = (
    ("fully_masked", ("semantics", ("fully_masked", "empty_sizes"))),
    ("padded_rows", ("semantics", ("padded_rows",))),
    ("causal_alignment", ("semantics", ("causal_alignment",))),
    ("effective_precision", ("semantics", ("effective_precision",))),
    ("lse_base", ("semantics", ("lse_base",))),
    ("empty_lse", ("semantics", ("empty_lse",))),
    ("lse_with_sinks", ("semantics", ("lse_with_sinks",))),
    ("deterministic", ("semantics", ("deterministic_forward", "deterministic_backward"))),
    ("batch_invariant", ("semantics", ("batch_invariant",))),
    ("knobs", ("conformance", ("knob_",))),
    ("merge", ("conformance", ("merge_",))),
    ("p_dtypes", ("semantics", ("p_dtype",))),  # fp8: P's rounding before P V, per fp8 dtype
    ("rejects_bad_indices", ("semantics", tuple(f"bad_index_{k}" for k in _BAD_INDICES))),
)


# how a question reads beside another answering the same declaration (one value when they agree)
SHORT = {"fully_masked": "masked row", "empty_sizes": "Lq or Lk = 0", "deterministic_forward": "forward",
         "deterministic_backward": "backward"}


def declared_text(name: str, d: dict) -> str:
    """A declaration as the table shows it: '' when not declared, 'none' for no knob or no merge."""
    value = d.get(name)
    if name == "knobs":
        if not value:
            return "none"
        domains = "; ".join(f"{k} ∈ {{{', '.join(map(str, v))}}}" for k, v in value.items())
        return domains + (" (bitwise)" if d.get("knob_exact") else " (within budget)")
    if name == "merge":
        return value or "none"
    if name == "p_dtypes":
        return " · ".join(f"{DTYPE_SHORT.get(k, k)}: {DTYPE_SHORT.get(v, v)}" for k, v in sorted((value or {}).items()))
    if value is None:
        return ""
    return {True: "yes", False: "no"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def _per_dtype(rows) -> str:
    """One value when every dtype observed the same, else 'f64: a · f32: b' (each dtype's own name: "the input's
    dtype", as the semantics matrix says it)."""
    seen = {text(r["dtype"]): text(r["observed"]) for r in rows}
    if len(seen) > 1 and all(d == o for d, o in seen.items()):
        return "the input's dtype"
    if len(set(seen.values())) == 1:
        return next(iter(seen.values()))
    return " · ".join(f"{DTYPE_SHORT.get(d, d)}: {o}" for d, o in sorted(seen.items(), reverse=True))


def _from_semantics(sem: pd.DataFrame, backend: str, questions) -> tuple:
    mine = sem[(sem["backend"] == backend) & sem["question"].isin(questions)]
    parts = {}
    for q in questions:
        rows = [r for _, r in mine[mine["question"] == q].iterrows()]
        if rows:
            parts[q] = _per_dtype(rows)
    judged = [tri(a) for a in mine["agrees"]]
    agrees = False if False in judged else True if True in judged else None
    if len(set(parts.values())) <= 1:
        return next(iter(parts.values()), ""), agrees
    return "; ".join(f"{SHORT.get(q, q)}: {o}" for q, o in parts.items()), agrees


def _from_conformance(conf: pd.DataFrame, backend: str, prefixes) -> tuple:
    mine = conf[(conf["backend"] == backend) & conf["property"].astype(str).str.startswith(tuple(prefixes))]
    ran = mine[mine["status"] != "skipped"]
    if ran.empty:
        return ("not run" if len(mine) else ""), None
    bad = ran[ran["status"].isin(("failed", "error", "crashed", "timed_out"))]
    if len(bad):
        first = bad.iloc[0]
        return f"{len(bad)} of {len(ran)} checks failed ({first['property']} at {first['dtype']})", False
    return f"{len(ran)} checks passed", True


def conventions_frame(declarations, sem: pd.DataFrame, conf: pd.DataFrame) -> pd.DataFrame:
    """One row per backend and convention: declared, observed, agrees, source (conventions.csv)."""
    latest = {d["backend"]: d for d in declarations}  # several runs of one backend: the last one's word
    rows = []
    for backend in sorted(latest):
        d = latest[backend]
        for name, (kind, keys) in CONVENTIONS:
            observe = _from_semantics if kind == "semantics" else _from_conformance
            observed, agrees = observe(sem if kind == "semantics" else conf, backend, keys)
            declared = declared_text(name, d)
            if declared == "none" and observed == "not run":  # nothing offered, nothing to run: no news
                observed = ""
            rows.append({"backend": backend, "convention": name, "declared": declared, "observed": observed,
                         "agrees": agrees if (declared or kind == "conformance") else None,
                         "source": ", ".join(keys)})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def conventions_data(f) -> dict:
    """The page's table: backends as rows, conventions as columns, each cell declared over observed."""
    df = f.conventions
    if df is None or df.empty:
        return {"columns": [], "rows": []}
    columns = [name for name, _ in CONVENTIONS]
    rows = []
    for backend, g in df.groupby("backend", sort=True):
        by = {r["convention"]: r for _, r in g.iterrows()}
        cells = []
        for name in columns:
            r = by.get(name)
            agrees = None if r is None else tri(r["agrees"])
            kind = "agree" if agrees is True else "disagree" if agrees is False else "recorded"
            cells.append(None if r is None else {"kind": kind if text(r["observed"]) else "none",
                                                 "declared": text(r["declared"]), "observed": text(r["observed"])})
        rows.append({"backend": backend, "cells": cells})
    sources = {name: keys for name, (_, keys) in CONVENTIONS}
    return {"columns": [(c, ", ".join(sources[c])) for c in columns], "rows": rows}
