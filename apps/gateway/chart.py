"""A stacked bar chart as inline SVG, rendered on the server (the admin's
usage page: no script, no CDN). Every label is escaped; numbers are laid out
on a linear scale from 0 to the tallest day's total."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from html import escape

WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 70, 180, 20, 40
# Colour-blind-safe palette (Okabe-Ito); series past its length reuse it.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")


@dataclass(frozen=True)
class Series:
    name: str
    values: tuple[float, ...]  # one per day, in the chart's day order


def stacked_bars(*, title: str, days: list[date], series: list[Series], unit: str) -> str:
    """An <svg> with one stacked bar per day (a segment per series), a y axis, and a legend."""
    totals = [sum(s.values[i] for s in series) for i in range(len(days))]
    top = max(totals, default=0.0) or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" class="usage-chart" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        *_axis(top, unit),
        *_bars(days, series, top),
        *_legend(series),
    ]
    return "".join(parts) + "</svg>"


def _plot_height() -> int:
    return HEIGHT - TOP - BOTTOM


def _axis(top: float, unit: str) -> list[str]:
    out = [f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}" stroke="#888"/>']
    for k in range(5):
        value = top * k / 4
        y = HEIGHT - BOTTOM - _plot_height() * k / 4
        out.append(f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="10">{escape(_fmt(value, unit))}</text>'
        )
    return out


def _bars(days: list[date], series: list[Series], top: float) -> list[str]:
    out: list[str] = []
    slot = (WIDTH - LEFT - RIGHT) / max(len(days), 1)
    bar = max(slot * 0.7, 1.0)
    for i, day in enumerate(days):
        x, base = LEFT + i * slot + (slot - bar) / 2, float(HEIGHT - BOTTOM)
        for n, s in enumerate(series):
            h = _plot_height() * s.values[i] / top
            if h <= 0:
                continue
            base -= h
            tip = f"{day.isoformat()} {s.name}: {s.values[i]:g}"
            out.append(
                f'<rect x="{x:.1f}" y="{base:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{PALETTE[n % len(PALETTE)]}"><title>{escape(tip)}</title></rect>'
            )
        label = day.strftime("%m-%d")
        out.append(f'<text x="{x + bar / 2:.1f}" y="{HEIGHT - BOTTOM + 14}" text-anchor="middle" font-size="10">')
        out.append(f"{label}</text>")
    return out


def _legend(series: list[Series]) -> list[str]:
    out: list[str] = []
    for n, s in enumerate(series):
        y = TOP + 14 * n
        colour = PALETTE[n % len(PALETTE)]
        out.append(f'<rect x="{WIDTH - RIGHT + 10}" y="{y}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{WIDTH - RIGHT + 24}" y="{y + 9}" font-size="11">{escape(s.name or "(shared)")}</text>')
    return out


def _fmt(value: float, unit: str) -> str:
    if unit == "$":
        return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"
    return f"{value:,.0f}"
