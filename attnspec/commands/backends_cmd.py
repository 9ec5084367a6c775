"""attnspec backends: every backend, whether it runs here (or why not), and what it declares.

Built-ins and installed entry points are always listed; `--backend NAME` adds plug-ins
given as ``package.module:attr``.  A broken entry point is listed as unavailable with its
error; a broken `--backend` name is a user error (exit 2).
"""
from __future__ import annotations

import json

from attnspec.errors import UserError

_COLUMNS = ("name", "available", "device", "dtypes", "gradients", "masks", "causal",
            "fully_masked", "causal_alignment")
# The features table: (column, feature name of specs.problem.FEATURES or a row key)
_FEATURE_COLUMNS = (("gqa", "gqa"), ("bias", "bias"), ("dbias", "bias_gradient"),
                    ("bottom_right", "causal_bottom_right"), ("window", "window"), ("seq_lengths", "seq_lengths"),
                    ("segment_ids", "segment_ids"), ("softcap", "softcap"), ("alibi", "alibi"), ("lse", "lse"),
                    ("padded_rows", "padded_rows"))


def add_parser(sub):
    p = sub.add_parser("backends", help="list backends: availability, device, dtypes, gradients, declared semantics",
                       description=__doc__.splitlines()[0])
    p.add_argument("--backend", action="append", default=[], metavar="NAME",
                   help="also list NAME (built-in, entry point or package.module:attr); repeatable")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.set_defaults(func=run)
    return p


def _rows(extra_names) -> list[dict]:
    from attnspec.backends import registry

    rows = [_with_support(registry.resolve(n).describe()) for n in registry.builtin_names()]
    listed = set(registry.builtin_names())
    for name in registry.entry_points():
        if name in listed:
            continue
        listed.add(name)
        try:
            rows.append(_describe(registry.resolve(name), name))
        except registry.BackendSelectionError as e:
            rows.append(_with_support({"name": name, "available": False, "reason": str(e), "device": "?",
                                       "dtypes": [], "gradients": False, "masks": False, "causal": False,
                                       "equal_head_dims": False, "features": [], "bias_gradient": False,
                                       "fully_masked": None, "causal_alignment": None, "padded_rows": None,
                                       "effective_precision": None, "notes": []}))
    for name in extra_names:
        if name in listed:
            continue
        listed.add(name)
        try:
            backend = registry.resolve(name)
        except registry.BackendSelectionError as e:
            raise UserError(str(e)) from None
        rows.append(_describe(backend, name))
    return rows


def _describe(backend, name: str) -> dict:
    """describe(), listed under the name that selects it (results report backend.name)."""
    row = _with_support(backend.describe())
    if row["name"] != name:
        row["notes"] = [f"reports results as {row['name']!r}"] + row["notes"]
    return {**row, "name": name}


def _with_support(row: dict) -> dict:
    """Adds "supports": every feature of specs.problem.FEATURES -> declared natively or not."""
    from attnspec.specs.problem import FEATURES

    return {**row, "supports": {f: f in (row.get("features") or ()) for f in FEATURES}}


def _feature_cell(row, key) -> str:
    if key == "padded_rows":
        return row.get("padded_rows") or "-"
    if key == "bias_gradient":
        return "yes" if row.get("bias_gradient") and "bias" in row["supports"] and row["supports"]["bias"] else "."
    return "yes" if row["supports"].get(key) else "."


def _aligned(header, cells) -> list:
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths)).rstrip(), "  ".join("-" * w for w in widths)]
    return lines + ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def format_features(rows) -> str:
    """One line per backend, one column per optional feature: what it takes natively."""
    header = ("name",) + tuple(c for c, _ in _FEATURE_COLUMNS)
    cells = [[r["name"]] + [_feature_cell(r, key) for _, key in _FEATURE_COLUMNS] for r in rows]
    return "\n".join(["features declared (taken natively; '.' = Unsupported, never emulated):"]
                     + _aligned(header, cells))


def _cell(row, col) -> str:
    value = row.get(col)
    if col == "available":
        return "yes" if value else f"no: {row.get('reason', '')}"
    if col == "dtypes":
        return ",".join(d.replace("float", "f").replace("bf16", "bf16") for d in value) or "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "-" if value is None else str(value)


def format_table(rows) -> str:
    lines = _aligned(_COLUMNS, [[_cell(r, c) for c in _COLUMNS] for r in rows])
    lines += ["", format_features(rows)]
    notes = [(r["name"], n) for r in rows for n in (
        ([f"effective precision {r['effective_precision']}"] if r.get("effective_precision") else [])
        + (["needs Ev == E (value's last dimension equal to query's)"] if r.get("equal_head_dims") else [])
        + ([f"needs head dims E and Ev that are multiples of {r['head_dim_multiple']}"]
           if (r.get("head_dim_multiple") or 1) > 1 else [])
        + list(r.get("notes") or []))]
    if notes:
        lines += ["", "notes:"] + [f"  {name}: {note}" for name, note in notes]
    lines += ["", "dtypes: f16 float16, bf16 bfloat16, f32 float32, f64 float64; "
                  "'-' under a semantics column: not declared (recorded, never failed); "
                  "dbias: the backward returns the bias gradient; padded_rows: what a query row past "
                  "q_lengths outputs"]
    return "\n".join(lines)


def run(args) -> int:
    rows = _rows(args.backend)
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0
