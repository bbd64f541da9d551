"""Small inline-SVG line plots for the HTML reports (no plotting library, no external files).

A plot is a few polylines over a frame axis. Missing values (None, NaN, inf) break the line, so a
failed estimate shows as a gap rather than as a made-up number; `markers_at` draws small crosses
on the x axis for such frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


@dataclass
class Series:
    label: str
    xs: list[float]
    ys: list[float | None]
    color: str | None = None
    dashed: bool = False
    markers_at: list[float] = field(default_factory=list)  # x positions to flag (e.g. failed pairs)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        high = low + 1.0
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.floor(low / step) * step
    ticks = [round(start, 10)]
    while ticks[-1] < high - step * 1e-9:  # the last tick is at or above `high`
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _format(value: float) -> str:
    return f"{value:g}" if abs(value) >= 0.01 or value == 0 else f"{value:.1e}"


LEGEND_ROW_PX = 15  # one more row of legend entries
LEGEND_CHAR_PX = 6.5  # an upper bound of a character's width at font-size 11 (no font metrics in SVG text)


def _legend_layout(labels: list[str], left: float, right_edge: float) -> list[tuple[float, int]]:
    """(x, row) of each legend entry (a 14-px line, a gap, the label): left to right, a new row where the
    next entry would pass `right_edge`."""
    out, x, row = [], left, 0
    for label in labels:
        entry = 18 + LEGEND_CHAR_PX * len(label)
        if x > left and x + entry > right_edge:
            x, row = left, row + 1
        out.append((x, row))
        x += entry + 16
    return out


def line_plot(
    series: list[Series],
    title: str,
    x_label: str,
    y_label: str,
    element_id: str,
    width: int = 600,
    height: int = 240,
    y_min: float | None = None,
) -> str:
    """An <svg> element as a string; empty data gives a plot that says so. The legend wraps onto more rows
    (the plot grows by them) rather than run past the right edge."""
    left, right, top, bottom = 56, 12, 42, 40
    legend = _legend_layout([s.label for s in series], left, width - right)
    extra = LEGEND_ROW_PX * (max(row for _, row in legend) if legend else 0)
    top, height = top + extra, height + extra
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [x for s in series for x in s.xs] + [x for s in series for x in s.markers_at]
    ys = [y for s in series for y in s.ys if _finite(y)]
    parts = [
        f'<svg id="{escape(element_id)}" class="plot" xmlns="http://www.w3.org/2000/svg" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{left}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    if not xs or not ys:
        parts.append(f'<text x="{left + 10}" y="{top + plot_h / 2}" font-size="13" fill="#888">no data</text></svg>')
        return "".join(parts)
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_hi = x_lo + 1
    y_lo = min(ys) if y_min is None else min(y_min, min(ys))
    y_ticks = _nice_ticks(y_lo, max(ys))
    y_lo, y_hi = y_ticks[0], y_ticks[-1]

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return top + plot_h - (y - y_lo) / (y_hi - y_lo) * plot_h

    for tick in y_ticks:
        parts.append(
            f'<line x1="{left}" y1="{py(tick):.1f}" x2="{left + plot_w}" y2="{py(tick):.1f}" stroke="#e5e5e5"/>'
        )
        parts.append(
            f'<text x="{left - 6}" y="{py(tick) + 4:.1f}" font-size="11" text-anchor="end">{_format(tick)}</text>'
        )
    for tick in _nice_ticks(x_lo, x_hi, 8):
        if x_lo <= tick <= x_hi:
            parts.append(
                f'<text x="{px(tick):.1f}" y="{top + plot_h + 15}" font-size="11" '
                f'text-anchor="middle">{_format(tick)}</text>'
            )
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>')
    parts.append(
        f'<text x="{left + plot_w / 2}" y="{height - 6}" font-size="12" text-anchor="middle">{escape(x_label)}</text>'
    )
    parts.append(
        f'<text x="14" y="{top + plot_h / 2}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + plot_h / 2})">{escape(y_label)}</text>'
    )
    for index, s in enumerate(series):
        color = s.color or PALETTE[index % len(PALETTE)]
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        runs, run = [], []
        for x, y in zip(s.xs, s.ys, strict=True):
            if _finite(y):
                run.append(f"{px(x):.1f},{py(y):.1f}")
            elif run:
                runs.append(run)
                run = []
        if run:
            runs.append(run)
        for points in runs:
            if len(points) == 1:
                x, y = points[0].split(",")
                parts.append(f'<circle cx="{x}" cy="{y}" r="2" fill="{color}"/>')
            else:
                parts.append(
                    f'<polyline points="{" ".join(points)}" fill="none" stroke="{color}" stroke-width="1.6"{dash}/>'
                )
        for x in s.markers_at:
            cx, cy = px(x), top + plot_h - 4
            parts.append(
                f'<path d="M{cx - 3:.1f},{cy - 3:.1f}L{cx + 3:.1f},{cy + 3:.1f}'
                f'M{cx - 3:.1f},{cy + 3:.1f}L{cx + 3:.1f},{cy - 3:.1f}" stroke="{color}"/>'
            )
        legend_x, row = legend[index]
        legend_y = 33 + LEGEND_ROW_PX * row
        parts.append(
            f'<line x1="{legend_x}" y1="{legend_y - 4}" x2="{legend_x + 14}" y2="{legend_y - 4}" '
            f'stroke="{color}" stroke-width="2"{dash}/>'
        )
        parts.append(f'<text x="{legend_x + 18}" y="{legend_y}" font-size="11">{escape(s.label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def histogram(
    values: list[float | None],
    title: str,
    x_label: str,
    element_id: str,
    bins: int = 12,
    width: int = 420,
    height: int = 220,
    color: str = PALETTE[0],
) -> str:
    """An <svg> histogram of the finite values (None/NaN/inf are left out and counted in the title)."""
    finite = [v for v in values if _finite(v)]
    missing = len(values) - len(finite)
    if missing:
        title = f"{title} ({missing} without a value)"
    left, right, top, bottom = 44, 12, 30, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    parts = [
        f'<svg id="{escape(element_id)}" class="plot histogram" xmlns="http://www.w3.org/2000/svg" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{left}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    if not finite:
        parts.append(f'<text x="{left + 10}" y="{top + plot_h / 2}" font-size="13" fill="#888">no data</text></svg>')
        return "".join(parts)
    low, high = min(finite), max(finite)
    if high == low:
        low, high = low - 0.5, high + 0.5
    step = (high - low) / bins
    counts = [0] * bins
    for v in finite:
        counts[min(bins - 1, int((v - low) / step))] += 1
    y_ticks = _nice_ticks(0, max(counts), min(4, max(counts)))  # counts: whole-number ticks
    y_hi = y_ticks[-1]
    for tick in y_ticks:
        y = top + plot_h - tick / y_hi * plot_h
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{_format(tick)}</text>')
    bar_w = plot_w / bins
    for index, count in enumerate(counts):
        if count:
            bar_h = count / y_hi * plot_h
            x0 = low + index * step
            parts.append(
                f'<rect class="bar" x="{left + index * bar_w + 1:.1f}" y="{top + plot_h - bar_h:.1f}" '
                f'width="{bar_w - 2:.1f}" height="{bar_h:.1f}" fill="{color}">'
                f"<title>{_format(x0)} to {_format(x0 + step)}: {count}</title></rect>"
            )
    for tick in _nice_ticks(low, high, 5):
        if low <= tick <= high:
            x = left + (tick - low) / (high - low) * plot_w
            parts.append(
                f'<text x="{x:.1f}" y="{top + plot_h + 15}" font-size="11" text-anchor="middle">{_format(tick)}</text>'
            )
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>')
    parts.append(
        f'<text x="{left + plot_w / 2}" y="{height - 6}" font-size="12" text-anchor="middle">'
        f"{escape(x_label)}</text></svg>"
    )
    return "".join(parts)
