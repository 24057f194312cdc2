"""Small inline SVG line charts for the operations page: no script, no CDN, escaped labels."""

from __future__ import annotations

from html import escape

from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT, PAD = 560, 120, 4
COLOURS = ("#417690", "#ba2121", "#79aec8", "#c4a000")
Series = tuple[str, list[tuple[float, float]]]  # (label, [(epoch seconds, value)])


def _points(values: list[tuple[float, float]], start: float, end: float, top: float) -> str:
    span = max(end - start, 1.0)
    out = []
    for t, v in values:
        x = PAD + (t - start) / span * (WIDTH - 2 * PAD)
        y = HEIGHT - PAD - (v / top) * (HEIGHT - 2 * PAD) if top else HEIGHT - PAD
        out.append(f"{x:.1f},{y:.1f}")
    return " ".join(out)


def line_chart(title: str, series: list[Series], start: float, end: float, unit: str = "") -> SafeString:
    """One chart: a polyline per series over ``[start, end]``, y from 0 to the largest value."""
    top = max((v for _, values in series for _, v in values), default=0.0)
    lines, legend = [], []
    for i, (label, values) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        if values:
            lines.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                f'points="{_points(values, start, end, top)}"/>'
            )
        last = f"{values[-1][1]:g}" if values else "-"
        legend.append(f'<span style="color:{colour}">&#9632;</span> {escape(label)} (now {escape(last)})')
    empty = "" if lines else f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">no data yet</text>'
    return mark_safe(
        f'<figure class="ops-chart"><figcaption>{escape(title)}: max {top:g} {escape(unit)} '
        f"over 24 h</figcaption>"
        f'<svg width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}"><rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="none" '
        f'stroke="#ccc"/>{"".join(lines)}{empty}</svg><div class="help">{" &nbsp; ".join(legend)}</div></figure>'
    )
