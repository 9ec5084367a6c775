"""Plots as inline SVG (matplotlib, Agg): time and memory against T, GFLOP/s with the roofline.

Text stays text in the SVG (svg.fonttype none) so the page is small and searchable;
matplotlib escapes it as XML.  Labels come from backends, so '$' is escaped to keep
matplotlib's mathtext from interpreting a name.
"""
from __future__ import annotations

import hashlib
import io
import re
from collections import Counter

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

_PLAIN = FuncFormatter(lambda y, _: f"{y:g}")

OP_TITLES = {"forward": "forward", "forward_backward": "forward + backward"}
_STYLE = {"svg.fonttype": "none", "svg.hashsalt": "attnspec", "font.size": 10, "axes.grid": True,
          "xtick.major.size": 0, "ytick.major.size": 0, "xtick.minor.size": 0, "ytick.minor.size": 0,
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
    svg = re.sub(r'<svg([^>]*?) width="([^"]*)" height="[^"]*"', r'<svg\1 class="plot" style="max-width:\2"',
                 svg, count=1)
    return compact(svg)


def compact(svg: str) -> str:
    """The same drawing in a third of the bytes: coordinates to 0.1 pt (a page is ~1000 pt wide),
    repeated styles as classes (named from the drawing's hash: every inline SVG's <style> applies
    to the whole page), one font rule, no ids nothing refers to, no no-op rotations or wrappers."""
    svg = re.sub(r'="[^"]*"', lambda m: re.sub(r"(\d\.\d)\d+", r"\1", re.sub(r"\s*\n\s*", " ", m.group(0))),
                 svg)  # attributes (a path's points on one line), not text
    svg = re.sub(r"font-family: [^;\"]*(; )?", "", svg)
    svg = re.sub(r' transform="rotate\(-?0 [^)]*\)"', "", svg)
    svg = re.sub(r'<g id="[^"]*"/>\s*', "", svg)
    svg = re.sub(r'<g id="[^"]*">', "<g>", svg)
    svg = re.sub(r"\s*\n\s*", "\n", svg)
    unwrapped = None
    while unwrapped != svg:
        unwrapped, svg = svg, re.sub(r"<g>\n(<(?:path|use|text|g)[^\n]*/>|<text[^\n]*</text>)\n</g>", r"\1", svg)
    prefix = "c" + hashlib.sha1(svg.encode()).hexdigest()[:5]
    styles = [st for st, n in Counter(re.findall(r' style="([^"]*)"', svg)).items() if n > 1]
    names = {st: f"{prefix}{i}" for i, st in enumerate(styles)}
    svg = re.sub(r' style="([^"]*)"', lambda m: f' class="{names[m.group(1)]}"' if m.group(1) in names else m.group(0), svg)
    rules = "".join(f"svg.plot .{n}{{{st}}}" for st, n in names.items())  # above `svg.plot *`, as inline styles were
    return svg.replace("<style type=\"text/css\">*{",
                       f"<style type=\"text/css\">svg.plot text{{font-family:system-ui,sans-serif}}{rules}svg.plot *{{", 1)


def _series(sub, several_machines: bool):
    """(label, T, values) per backend (and machine, when results come from several)."""
    keys = ["backend", "machine"] if several_machines else ["backend"]
    for key, g in sub.groupby(keys):
        key = key if isinstance(key, tuple) else (key,)
        g = g.dropna(subset=["value"]).sort_values("T")
        if not g.empty:
            yield key, " @ ".join(str(k) for k in key), g["T"].to_numpy(), g["value"].to_numpy()


def _axes_T(ax, ts, spread: float = 4.0) -> None:
    """log2 x axis labelled with the measured T values themselves (4, 16, ... not 2^k), each label
    at least `spread` times the one before (the last one kept) so narrow panels stay legible."""
    ax.set_xscale("log", base=2)
    ts = sorted(set(int(t) for t in ts))
    ticks = []
    for t in ts:
        if not ticks or t >= spread * ticks[-1]:
            ticks.append(t)
    if ts and ticks[-1] != ts[-1]:
        ticks[-1] = ts[-1]
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("sequence length T")


MEMBER_STYLES = ("-", "--", ":", "-.")  # a family's first members by line style; markers after them


def _colours(sub) -> dict:
    """backend -> (colour, line style, marker): one colour per family (numpy, torch, ...), a line
    style per member (a marker from the fifth on), so a panel with two dozen lines still reads as
    a few groups - and stays small: a marker is an SVG node per point."""
    cmap = plt.get_cmap("tab10")
    names = sorted(set(sub["backend"].astype(str)), key=lambda n: (family(n), n))
    fams = sorted({family(n) for n in names})
    out, seen = {}, {}
    for n in names:
        i = seen[family(n)] = seen.get(family(n), -1) + 1
        out[n] = (cmap(fams.index(family(n)) % 10), MEMBER_STYLES[i % 4], None if i < 4 else "osD^"[(i - 4) % 4])
    return out


FAMILY_COLUMNS = 4  # panels a row in the small multiples


def family(backend) -> str:
    """The panel a backend is drawn in: its framework (the name's first word); plug-ins share one."""
    name = str(backend)
    return "plug-ins" if ":" in name or "." in name else name.split("-")[0]


def family_panels(rows, ylabel: str, *, best: str, slopes: dict | None = None, slope_key=None,
                  roofs=(), scale: float = 1.0) -> str | None:
    """Small multiples: one log-log panel per family of backends (numpy, torch, jax, ...), the same
    axes in each, so a family's lines are told apart and still compare across panels: each panel
    also draws the best value any backend reached at each T (`best`: "min" or "max") in grey.

    rows: one metric and op (columns backend, machine, T, value); roofs: [(label, y)] in every panel;
    slopes: legend tags, slope_key(backend, machine) -> the key into slopes."""
    rows = rows.dropna(subset=["value"])
    if rows.empty:
        return None
    several = rows["machine"].nunique() > 1
    first_machine = sorted(rows["machine"].astype(str).unique())[0]
    fams = sorted({family(b) for b in rows["backend"]}, key=lambda f: (f != "plug-ins", f))  # yours first
    envelope = rows.groupby("T")["value"].agg(best).sort_index()
    n_cols = min(FAMILY_COLUMNS, len(fams))
    n_rows = -(-len(fams) // n_cols)
    cmap = plt.get_cmap("tab10")
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(n_rows, n_cols, figsize=(3.5 * n_cols, 2.7 * n_rows), squeeze=False,
                                 sharex=True, sharey=True)
        for ax, fam in zip(axes.flat, fams, strict=False):  # the grid's spare cells stay empty
            if len(fams) > 1:
                ax.plot(envelope.index, envelope.to_numpy() * scale, color="0.6", linewidth=2.2, alpha=0.5,
                        label="best of all backends")
            part = rows[rows["backend"].map(family) == fam]
            names = sorted(set(part["backend"].astype(str)))
            for key, name, t, y in _series(part, several):
                tag = ""
                if slopes is not None:
                    slope = slopes.get(slope_key(*key) if several else slope_key(key[0], None))
                    tag = f" ({slope:.2f})" if slope is not None and slope == slope else ""
                i = names.index(str(key[0]))  # a family has a few lines: colour tells them apart, no markers
                ax.plot(t, y * scale, color=cmap(i % 10), linewidth=1.3,
                        linestyle="-" if not several or str(key[1]) == first_machine else "--", label=label(name + tag))
            for text, y in roofs:
                ax.axhline(y, color="black", linestyle="--", linewidth=0.9, label=label(text))
            ax.set_title(label(fam), fontsize=10, loc="left")
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(_PLAIN)  # "0.001", not mathtext's 10^-3 (a dozen SVG nodes each)
            ax.yaxis.set_minor_formatter(NullFormatter())
            _axes_T(ax, rows["T"].dropna())
            ax.set_xlabel("")
            ax.legend(fontsize=6.5, frameon=False, loc="best", handlelength=1.6, labelspacing=0.25)
        for ax in axes.flat[len(fams):]:
            ax.set_visible(False)
        for ax in axes[:, 0]:
            ax.set_ylabel(ylabel)
        for ax in axes[-1]:
            ax.set_xlabel("sequence length T")
        fig.tight_layout()
        return to_svg(fig)


def metric_vs_T(sub, metric: str, ylabel: str, slopes: dict, scale: float = 1.0) -> list:
    """Time or memory against T: [(op, small multiples)], the fitted slope of each line in its legend."""
    rows = sub[sub["metric"] == metric]
    ops = [op for op in OP_TITLES if op in set(rows["op"])] + sorted(set(rows["op"]) - set(OP_TITLES))
    out = []
    for op in ops:
        svg = family_panels(rows[rows["op"] == op], ylabel, best="min", slopes=slopes, scale=scale,
                            slope_key=lambda b, m, op=op: (b, op, metric) + ((m,) if m is not None else ()))
        if svg:
            out.append((OP_TITLES.get(op, op), svg))
    return out


def gflops_vs_T(sub, peaks: dict) -> list:
    """Achieved GFLOP/s against T: [(op, small multiples)], each machine's float32 matmul peak as the roof."""
    rows = sub[sub["metric"] == "gflops"]
    several = rows["machine"].nunique() > 1 if not rows.empty else False
    roofs = [(f"matmul peak {peak:.0f}" + (f" ({machine})" if several else ""), peak)
             for machine, peak in sorted(peaks.items())]
    ops = [op for op in OP_TITLES if op in set(rows["op"])] + sorted(set(rows["op"]) - set(OP_TITLES))
    out = []
    for op in ops:
        svg = family_panels(rows[rows["op"] == op], "GFLOP/s (cost model)", best="max", roofs=roofs)
        if svg:
            out.append((OP_TITLES.get(op, op), svg))
    return out


def _lines(ax, part, x: str, colours, several: bool, style=None) -> None:
    """One line per backend (per machine when several) against column `x`."""
    keys = ["backend", "machine"] if several else ["backend"]
    for key, g in part.groupby(keys):
        key = key if isinstance(key, tuple) else (key,)
        g = g.dropna(subset=["value"]).sort_values(x)
        if g.empty:
            continue
        colour, member_style, marker = colours[str(key[0])]
        ax.plot(g[x].to_numpy(), g["value"].to_numpy(), color=colour, marker=marker, markersize=3.5, linewidth=1.4,
                linestyle=style or member_style, label=label(" @ ".join(str(k) for k in key)))


ROOF = "\u2060"  # marks a roof's label (an invisible joiner): roofs keep a legend in their panel


def _roof_legend(ax) -> None:
    roofs = [(h, t) for h, t in zip(*ax.get_legend_handles_labels(), strict=True) if t.startswith(ROOF)]
    if roofs:
        ax.legend([h for h, _ in roofs], [t[1:] for _, t in roofs], fontsize=7, frameon=False, loc="lower right")


def _backend_legend(fig, axes) -> None:
    """One legend under the panels for every backend line (a legend per panel would repeat it)."""
    seen = {}
    for ax in axes:
        for h, t in zip(*ax.get_legend_handles_labels(), strict=True):
            if not t.startswith(ROOF):
                seen.setdefault(t, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), fontsize=7.5, frameon=False, loc="upper center",
                   bbox_to_anchor=(0.5, 0.0), ncol=min(6, max(1, len(seen) // 3 + 1)))


def _log2_axis(ax, values, name: str) -> None:
    _axes_T(ax, values)
    ax.set_xlabel(name)


def _bandwidth_panels(rows, roofs: dict, panel: str, x: str, title, xlabel: str) -> str | None:
    """KV-read GB/s against column `x`, one panel per value of column `panel` (title(value) its title),
    under the measured bandwidth roofs {(machine, kernel, size label): GB/s}."""
    if rows.empty:
        return None
    several = rows["machine"].nunique() > 1
    colours = _colours(rows)
    values = sorted(int(v) for v in rows[panel].dropna().unique())
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(1, len(values), figsize=(5.8 * len(values), 3.4), squeeze=False, sharey=True)
        for ax, value in zip(axes[0], values, strict=True):
            _lines(ax, rows[rows[panel] == value], x, colours, several)
            for (machine, kernel, size), gbps in sorted(roofs.items()):
                small = str(size).split()[0].isdigit() and int(str(size).split()[0]) < 64
                where = f", {machine}" if several else ""
                ax.axhline(gbps, color="black", linewidth=1.0, linestyle=":" if small else "--",
                           label=ROOF + label(f"{kernel} {size}: {gbps:.1f} GB/s{where}"))
            ax.set_title(title(value))
            ax.set_yscale("log")
            _log2_axis(ax, rows[x].dropna(), xlabel)
            _roof_legend(ax)
        axes[0][0].set_ylabel("KV read GB/s")
        _backend_legend(fig, axes[0])
        return to_svg(fig)


def decode_bandwidth(rows, roofs: dict) -> str | None:
    """KV-read GB/s against the cache length Lk, one panel per Lq, under the measured bandwidth.

    rows: kv_gbps rows (one dtype, Hkv = Hq); roofs: {(machine, kernel, size label): GB/s}."""
    return _bandwidth_panels(rows, roofs, "Lq", "Lk",
                             lambda lq: f"Lq = {lq} ({'one new token' if lq == 1 else 'speculative step, causal'})",
                             "KV cache length Lk")


def paged_bandwidth(rows, roofs: dict) -> str | None:
    """KV-read GB/s of a paged decode step against the page size, one panel per cache length Lk,
    under the measured bandwidth.  rows: kv_gbps rows of problem "paged_decode" (one dtype)."""
    return _bandwidth_panels(rows, roofs, "Lk", "page_size", lambda lk: f"one token a sequence, caches of {lk} keys",
                             "page size (keys)")


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
        for ax, v in zip(axes[0], values, strict=True):
            _lines(ax, rows[rows[panel] == v], "T", colours, several)
            for text, y in (roofs or {}).get(v, []):
                ax.axhline(y, color="black", linestyle="--", linewidth=1.0, label=ROOF + label(text))
            ax.set_title(label(titles.get(v, v)))
            ax.set_yscale("log")
            _axes_T(ax, rows["T"].dropna())
            _roof_legend(ax)
        axes[0][0].set_ylabel(ylabel)
        _backend_legend(fig, axes[0])
        return to_svg(fig)
