"""Server-rendered SVG charts: no JavaScript, no CDN (the dashboard must work offline)."""

from __future__ import annotations

import math
from html import escape

from markupsafe import Markup

from registry.dashboard.views import Standing
from registry.entities import AgreementSummary

WIDTH = 720
LABEL_W = 230
VALUE_W = 150
ROW_H = 30
TOP = 34
BOTTOM = 26


def leaderboard_chart(standings: list[Standing], *, metric: str, margin: float) -> Markup:
    """Main metric with its 95% CI per candidate; the champion's score plus the task's margin
    is drawn as the bar a challenger has to clear."""
    rows = [s for s in standings if s.score is not None]
    if not rows:
        return Markup('<p class="muted">No eval runs yet: nothing to chart.</p>')
    champion = next((s for s in rows if s.is_champion), None)
    bar = champion.score + margin if champion and champion.score is not None else None
    lows = [s.ci[0] if s.ci else s.score for s in rows]
    highs = [s.ci[1] if s.ci else s.score for s in rows]
    lo = min([v for v in lows if v is not None] + ([bar] if bar is not None else []))
    hi = max([v for v in highs if v is not None] + ([bar] if bar is not None else []))
    pad = max((hi - lo) * 0.08, 0.005)
    lo, hi = max(0.0, lo - pad), hi + pad
    plot_w = WIDTH - LABEL_W - VALUE_W
    height = TOP + ROW_H * len(rows) + BOTTOM

    def x(value: float) -> float:
        return LABEL_W + (value - lo) / (hi - lo) * plot_w

    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
        f'height="{height}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(metric)} with 95% confidence intervals</title>",
        f'<text x="{LABEL_W}" y="14" class="axis-title">{escape(metric)} (95% CI)</text>',
    ]
    for value in _ticks(lo, hi):
        gx = x(value)
        parts.append(
            f'<line x1="{gx:.1f}" y1="{TOP - 6}" x2="{gx:.1f}" y2="{height - BOTTOM}" '
            'class="grid"/>'
            f'<text x="{gx:.1f}" y="{height - 8}" class="tick">{value:g}</text>'
        )
    if bar is not None:
        bx = x(bar)
        parts.append(
            f'<line x1="{bx:.1f}" y1="{TOP - 10}" x2="{bx:.1f}" y2="{height - BOTTOM}" '
            f'class="bar-to-beat"/><text x="{bx + 4:.1f}" y="{TOP - 12}" class="bar-label">'
            f"champion + margin {bar:.3f}</text>"
        )
    for row, s in enumerate(rows):
        assert s.score is not None
        y = TOP + ROW_H * row + ROW_H / 2
        cls = "champion" if s.is_champion else ("passes" if s.check and s.check.passes else "other")
        ci_lo, ci_hi = s.ci if s.ci else (s.score, s.score)
        name = s.candidate.name if len(s.candidate.name) <= 30 else s.candidate.name[:29] + "…"
        parts.append(
            f'<g class="row {cls}"><text x="{LABEL_W - 10}" y="{y + 4:.1f}" class="label">'
            f"{escape(name)}</text>"
            f'<line x1="{x(ci_lo):.1f}" y1="{y:.1f}" x2="{x(ci_hi):.1f}" y2="{y:.1f}" class="ci"/>'
            f'<circle cx="{x(s.score):.1f}" cy="{y:.1f}" r="5" class="dot"/>'
            f'<text x="{WIDTH - VALUE_W + 10}" y="{y + 4:.1f}" class="value">{s.score:.4f} '
            f"[{ci_lo:.3f}, {ci_hi:.3f}]</text></g>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def _ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Round tick values (steps of 1, 2 or 5 times a power of ten) inside [lo, hi]."""
    raw = (hi - lo) / target
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * 0.7)
    first = math.ceil(lo / step) * step
    count = int((hi - first) / step + 1e-9) + 1
    return [round(first + i * step, 10) for i in range(count)]


AGREEMENT_H = 180


def agreement_chart(summary: AgreementSummary) -> Markup:
    """The shadow's agreement per time bucket (0..1) with each bucket's 95% CI, and the
    overall estimate as a line."""
    points = summary.series
    if not points or summary.estimate is None:
        return Markup('<p class="muted">No shadow replies judged yet: nothing to chart.</p>')
    left, right, top, bottom = 60, 20, 24, 30
    plot_w, plot_h = WIDTH - left - right, AGREEMENT_H - top - bottom

    def y(value: float) -> float:
        return top + (1.0 - max(0.0, min(1.0, value))) * plot_h

    step = plot_w / max(len(points), 1)
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {AGREEMENT_H}" width="{WIDTH}" '
        f'height="{AGREEMENT_H}" xmlns="http://www.w3.org/2000/svg">',
        "<title>agreement of the shadow with the champion over time, 95% CIs</title>",
        f'<text x="{left}" y="14" class="axis-title">agreement per bucket (95% CI); '
        f"overall {summary.estimate:.3f}</text>",
    ]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(
            f'<line x1="{left}" y1="{y(tick):.1f}" x2="{WIDTH - right}" y2="{y(tick):.1f}" '
            f'class="grid"/><text x="{left - 8}" y="{y(tick) + 4:.1f}" class="tick" '
            f'text-anchor="end">{tick:g}</text>'
        )
    overall = y(summary.estimate)
    parts.append(
        f'<line x1="{left}" y1="{overall:.1f}" x2="{WIDTH - right}" y2="{overall:.1f}" '
        'class="bar-to-beat"/>'
    )
    for i, point in enumerate(points):
        cx = left + step * (i + 0.5)
        parts.append(
            f'<g class="row other"><line x1="{cx:.1f}" y1="{y(point.high):.1f}" x2="{cx:.1f}" '
            f'y2="{y(point.low):.1f}" class="ci"/><circle cx="{cx:.1f}" '
            f'cy="{y(point.estimate):.1f}" r="4" class="dot"><title>'
            f"{escape(point.start.strftime('%Y-%m-%d %H:%M'))}: {point.estimate:.3f} "
            f"[{point.low:.3f}, {point.high:.3f}], {point.inputs} inputs</title></circle></g>"
        )
    parts.append(
        f'<text x="{left}" y="{AGREEMENT_H - 8}" class="tick">'
        f"{escape(points[0].start.strftime('%Y-%m-%d %H:%M'))}</text>"
    )
    parts.append("</svg>")
    return Markup("".join(parts))
