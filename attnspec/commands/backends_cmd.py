"""attnspec backends: whether a backend runs here (or why not), and what it declares.

With no option: every built-in and installed entry point.  ``--backend NAME`` (repeatable):
those backends alone - nothing else is resolved, so no other framework is imported; ``--all``
adds every built-in and entry point to them.  A broken entry point is listed as unavailable with
its error; a broken `--backend` name is a user error (exit 2).
"""
from __future__ import annotations

import json

from attnspec.errors import UserError

_COLUMNS = ("name", "available", "device", "dtypes", "gradients", "masks", "causal",
            "fully_masked", "causal_alignment")
def _feature_columns() -> tuple:
    """(column, key): every feature of the problem's table (specs.fields.FEATURES), dBias after the bias,
    and what a padded row gives."""
    from attnspec.specs.fields import FEATURES

    cols = []
    for f in FEATURES:
        cols.append((f.replace("causal_", ""), f))
        if f == "bias":
            cols.append(("dbias", "bias_gradient"))
    return tuple(cols) + (("padded_rows", "padded_rows"),)


def add_parser(sub):
    p = sub.add_parser("backends", help="list backends: availability, device, dtypes, gradients, declared semantics",
                       description=__doc__.splitlines()[0])
    p.add_argument("--backend", action="append", default=[], metavar="NAME",
                   help="describe NAME alone (built-in, entry point or package.module:attr); repeatable")
    p.add_argument("--all", action="store_true", help="every built-in and entry point too (the default without --backend)")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.set_defaults(func=run)
    return p


def _rows(extra_names, everything: bool = True) -> list[dict]:
    from attnspec.backends import registry

    names = registry.builtin_names() if everything else []
    rows = [_with_support(registry.resolve(n).describe()) for n in names]
    listed = set(names)
    for name in (registry.entry_points() if everything else ()):
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
    from attnspec.specs.fields import FEATURES

    return {**row, "supports": {f: f in (row.get("features") or ()) for f in FEATURES}}


def _feature_cell(row, key) -> str:
    if key == "padded_rows":
        return row.get("padded_rows") or "-"
    if key == "bias_gradient":
        return "yes" if row.get("bias_gradient") and "bias" in row["supports"] and row["supports"]["bias"] else "."
    return "yes" if row["supports"].get(key) else "."


def _aligned(header, cells) -> list:
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip(), "  ".join("-" * w for w in widths)]
    return lines + ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def format_features(rows) -> str:
    """One line per backend, one column per optional feature: what it takes natively."""
    columns = _feature_columns()
    header = ("name",) + tuple(c for c, _ in columns)
    cells = [[r["name"]] + [_feature_cell(r, key) for _, key in columns] for r in rows]
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
    rows = _rows(args.backend, everything=args.all or not args.backend)
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0
