"""attnspec backends: every backend, whether it runs here (or why not), and what it declares.

Built-ins and installed entry points are always listed; `--backend NAME` adds plug-ins
given as ``package.module:attr``.  A broken entry point is listed as unavailable with its
error; a broken `--backend` name is a user error (exit 2).
"""
from __future__ import annotations

import json

from ..errors import UserError

_COLUMNS = ("name", "available", "device", "dtypes", "gradients", "masks", "causal",
            "fully_masked", "causal_alignment")


def add_parser(sub):
    p = sub.add_parser("backends", help="list backends: availability, device, dtypes, gradients, declared semantics",
                       description=__doc__.splitlines()[0])
    p.add_argument("--backend", action="append", default=[], metavar="NAME",
                   help="also list NAME (built-in, entry point or package.module:attr); repeatable")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.set_defaults(func=run)
    return p


def _rows(extra_names) -> list[dict]:
    from backends import registry

    rows = [registry.resolve(n).describe() for n in registry.builtin_names()]
    listed = set(registry.builtin_names())
    for name in registry.entry_points():
        if name in listed:
            continue
        listed.add(name)
        try:
            rows.append(_describe(registry.resolve(name), name))
        except registry.BackendSelectionError as e:
            rows.append({"name": name, "available": False, "reason": str(e), "device": "?", "dtypes": [],
                         "gradients": False, "masks": False, "causal": False, "equal_head_dims": False,
                         "fully_masked": None,
                         "causal_alignment": None, "effective_precision": None, "notes": []})
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
    row = backend.describe()
    if row["name"] != name:
        row["notes"] = [f"reports results as {row['name']!r}"] + row["notes"]
    return {**row, "name": name}


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
    cells = [[_cell(r, c) for c in _COLUMNS] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(_COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(_COLUMNS, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    notes = [(r["name"], n) for r in rows for n in (
        ([f"effective precision {r['effective_precision']}"] if r.get("effective_precision") else [])
        + (["needs Ev == E (value's last dimension equal to query's)"] if r.get("equal_head_dims") else [])
        + list(r.get("notes") or []))]
    if notes:
        lines += ["", "notes:"] + [f"  {name}: {note}" for name, note in notes]
    lines += ["", "dtypes: f16 float16, bf16 bfloat16, f32 float32, f64 float64; "
                  "'-' under a semantics column: not declared (recorded, never failed)"]
    return "\n".join(lines)


def run(args) -> int:
    rows = _rows(args.backend)
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0
