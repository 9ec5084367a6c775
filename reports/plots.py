"""Plots as inline SVG (matplotlib, Agg): time and memory against T, GFLOP/s with the roofline.

Text stays text in the SVG (svg.fonttype none) so the page is small and searchable;
matplotlib escapes it as XML.  Labels come from backends, so '$' is escaped to keep
matplotlib's mathtext from interpreting a name.
"""
from __future__ import annotations

import io
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

OP_TITLES = {"forward": "forward", "forward_backward": "forward + backward"}
_STYLE = {"svg.fonttype": "none", "svg.hashsalt": "attnspec", "font.size": 10, "axes.grid": True,
          "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False}


def label(text) -> str:
    return str(text).replace("$", r"\$")


def to_svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]  # drop the XML prolog and DOCTYPE: the SVG sits inside HTML
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)  # RDF boilerplate and a timestamp
    # shrink with the page but never grow past the drawn size: a one-panel figure stretched to
    # the page's width would blow its fonts up to headline size
    return re.sub(r'<svg([^>]*?) width="([^"]*)" height="[^"]*"', r'<svg\1 class="plot" style="max-width:\2"',
                  svg, count=1)


def _series(sub, several_machines: bool):
    """(label, T, values) per backend (and machine, when results come from several)."""
    keys = ["backend", "machine"] if several_machines else ["backend"]
    for key, g in sub.groupby(keys):
        key = key if isinstance(key, tuple) else (key,)
        g = g.dropna(subset=["value"]).sort_values("T")
        if not g.empty:
            yield key, " @ ".join(str(k) for k in key), g["T"].to_numpy(), g["value"].to_numpy()


def _axes_T(ax, ts) -> None:
    """log2 x axis labelled with the measured T values themselves (4, 16, ... not 2^k)."""
    ax.set_xscale("log", base=2)
    ts = sorted(set(int(t) for t in ts))
    step = max(1, len(ts) // 8)  # at most ~8 labels
    ax.set_xticks(ts[::step])
    ax.set_xticklabels([str(t) for t in ts[::step]])
    ax.minorticks_off()
    ax.set_xlabel("sequence length T")


def _colours(sub) -> dict:
    """One colour (and marker) per series, the same in every plot of the page."""
    cmap = plt.get_cmap("tab10" if sub["backend"].nunique() <= 10 else "tab20")
    names = sorted(set(sub["backend"].astype(str)))
    return {n: (cmap(i % cmap.N), "osD^v<>p*h"[i // cmap.N % 10]) for i, n in enumerate(names)}


def _panels(rows, draw, ylabel: str) -> str:
    """One log-log panel per op; each panel's legend sits under it so no line is hidden."""
    ops = [op for op in OP_TITLES if op in set(rows["op"])] + sorted(set(rows["op"]) - set(OP_TITLES))
    colours = _colours(rows)
    n_series = rows.groupby(["backend", "machine"]).ngroups
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(1, len(ops), figsize=(5.8 * len(ops), 3.4), squeeze=False, sharey=True)
        for ax, op in zip(axes[0], ops):
            draw(ax, op, rows[rows["op"] == op], colours)
            ax.set_title(OP_TITLES.get(op, label(op)))
            ax.set_yscale("log")
            _axes_T(ax, rows["T"].dropna())
            ax.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                      ncol=2 if n_series > 3 else 1)
        axes[0][0].set_ylabel(ylabel)
        return to_svg(fig)


def metric_vs_T(sub, metric: str, ylabel: str, slopes: dict, scale: float = 1.0) -> str | None:
    """Time or memory against T, one line per backend with its fitted slope in the legend."""
    rows = sub[sub["metric"] == metric]
    if rows.empty:
        return None
    several = rows["machine"].nunique() > 1

    def draw(ax, op, part, colours):
        for key, name, t, y in _series(part, several):
            slope = slopes.get((key[0], op, metric) + ((key[1],) if several else ()))
            tag = f"  (slope {slope:.2f})" if slope is not None and slope == slope else ""
            colour, marker = colours[str(key[0])]
            ax.plot(t, y * scale, color=colour, marker=marker, markersize=3.5, linewidth=1.4,
                    linestyle="-" if not several or key[1] == sorted(rows["machine"].unique())[0] else "--",
                    label=label(name + tag))

    return _panels(rows, draw, ylabel)


def gflops_vs_T(sub, peaks: dict) -> str | None:
    """Achieved GFLOP/s against T, with each machine's measured float32 matmul peak as the roof."""
    rows = sub[sub["metric"] == "gflops"]
    if rows.empty:
        return None
    several = rows["machine"].nunique() > 1

    def draw(ax, op, part, colours):
        for key, name, t, y in _series(part, several):
            colour, marker = colours[str(key[0])]
            ax.plot(t, y, color=colour, marker=marker, markersize=3.5, linewidth=1.4, label=label(name))
        for machine, peak in sorted(peaks.items()):
            where = f" ({machine})" if several else ""
            ax.axhline(peak, color="black", linestyle="--", linewidth=1.0,
                       label=label(f"matmul peak {peak:.0f} GFLOP/s{where}"))

    return _panels(rows, draw, "GFLOP/s (cost model)")


def _lines(ax, part, x: str, colours, several: bool, style=None) -> None:
    """One line per backend (per machine when several) against column `x`."""
    keys = ["backend", "machine"] if several else ["backend"]
    for key, g in part.groupby(keys):
        key = key if isinstance(key, tuple) else (key,)
        g = g.dropna(subset=["value"]).sort_values(x)
        if g.empty:
            continue
        colour, marker = colours[str(key[0])]
        ax.plot(g[x].to_numpy(), g["value"].to_numpy(), color=colour, marker=marker, markersize=3.5, linewidth=1.4,
                linestyle=style or "-", label=label(" @ ".join(str(k) for k in key)))


def _log2_axis(ax, values, name: str) -> None:
    _axes_T(ax, values)
    ax.set_xlabel(name)


def decode_bandwidth(rows, roofs: dict) -> str | None:
    """KV-read GB/s against the cache length Lk, one panel per Lq, under the measured bandwidth.

    rows: kv_gbps rows (one dtype, Hkv = Hq); roofs: {(machine, kernel, size label): GB/s}."""
    if rows.empty:
        return None
    several = rows["machine"].nunique() > 1
    colours = _colours(rows)
    lqs = sorted(int(x) for x in rows["Lq"].dropna().unique())
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(1, len(lqs), figsize=(5.8 * len(lqs), 3.4), squeeze=False, sharey=True)
        for ax, lq in zip(axes[0], lqs):
            _lines(ax, rows[rows["Lq"] == lq], "Lk", colours, several)
            for (machine, kernel, size), gbps in sorted(roofs.items()):
                small = str(size).split()[0].isdigit() and int(str(size).split()[0]) < 64
                where = f", {machine}" if several else ""
                ax.axhline(gbps, color="black", linewidth=1.0, linestyle=":" if small else "--",
                           label=label(f"{kernel} {size}: {gbps:.1f} GB/s{where}"))
            ax.set_title(f"Lq = {lq} ({'one new token' if lq == 1 else 'speculative step, causal'})")
            ax.set_yscale("log")
            _log2_axis(ax, rows["Lk"].dropna(), "KV cache length Lk")
            ax.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
        axes[0][0].set_ylabel("KV read GB/s")
        return to_svg(fig)


def rate_by_panel(rows, panel: str, titles: dict, roofs: dict | None = None, ylabel: str = "GFLOP/s") -> str | None:
    """A metric against T, one panel per value of column `panel` (a dtype, a mask), optional
    horizontal roofs per panel value: {panel value: [(label, value)]}."""
    if rows.empty:
        return None
    several = rows["machine"].nunique() > 1
    colours = _colours(rows)
    values = list(dict.fromkeys(v for v in titles if v in set(rows[panel]))) + sorted(
        set(rows[panel].dropna()) - set(titles))
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(1, len(values), figsize=(5.2 * len(values), 3.4), squeeze=False, sharey=True)
        for ax, v in zip(axes[0], values):
            _lines(ax, rows[rows[panel] == v], "T", colours, several)
            for text, y in (roofs or {}).get(v, []):
                ax.axhline(y, color="black", linestyle="--", linewidth=1.0, label=label(text))
            ax.set_title(label(titles.get(v, v)))
            ax.set_yscale("log")
            _axes_T(ax, rows["T"].dropna())
            ax.legend(fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
        axes[0][0].set_ylabel(ylabel)
        return to_svg(fig)
