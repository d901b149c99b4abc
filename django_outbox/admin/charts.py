"""A throughput chart drawn on the server as inline SVG.

No JavaScript and nothing fetched from elsewhere: the admin page works behind a strict CSP and on an
air-gapped network, and the chart is readable by a screen reader through its ``<title>`` elements.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .overview import Minute

WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 12, 28
DELIVERED_COLOUR = "#2e7d32"
FAILED_COLOUR = "#c62828"


def _nice_ceiling(value: int) -> int:
    """A round axis maximum at or above ``value`` (1, 2, 5, 10, 20, 50, ...)."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def throughput_svg(minutes: Sequence[Minute]) -> SafeString:
    """Stacked bars per minute: delivered attempts below, failed or abandoned ones above."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    peak = _nice_ceiling(max([m.delivered + m.failed for m in minutes] + [1]))
    slot = plot_w / max(len(minutes), 1)
    bar_w = max(slot - 2, 1)
    bars = []
    for i, m in enumerate(minutes):
        x = LEFT + i * slot + 1
        delivered_h = plot_h * m.delivered / peak
        failed_h = plot_h * m.failed / peak
        label = f"{m.start:%H:%M} UTC: {m.delivered} delivered, {m.failed} failed"
        bars.append(
            (
                f"{x:.1f}",
                f"{TOP + plot_h - delivered_h:.1f}",
                f"{bar_w:.1f}",
                f"{delivered_h:.1f}",
                DELIVERED_COLOUR,
                f"{TOP + plot_h - delivered_h - failed_h:.1f}",
                f"{failed_h:.1f}",
                FAILED_COLOUR,
                label,
            )
        )
    bar_html = format_html_join(
        "\n",
        '<g><title>{8}</title><rect x="{0}" y="{1}" width="{2}" height="{3}" fill="{4}"/>'
        '<rect x="{0}" y="{5}" width="{2}" height="{6}" fill="{7}"/></g>',
        bars,
    )
    grid = format_html_join(
        "\n",
        '<line x1="{0}" x2="{1}" y1="{2}" y2="{2}" stroke="#ccc" stroke-dasharray="2,3"/>'
        '<text x="{3}" y="{4}" text-anchor="end" font-size="11" fill="#666">{5}</text>',
        (
            (LEFT, WIDTH - RIGHT, f"{TOP + plot_h * (1 - f):.1f}", LEFT - 4, f"{TOP + plot_h * (1 - f) + 4:.1f}", v)
            for f, v in ((0, 0), (0.5, peak // 2 if peak % 2 == 0 else f"{peak / 2:g}"), (1, peak))
        ),
    )
    first = f"{minutes[0].start:%H:%M}" if minutes else ""
    last = f"{minutes[-1].start:%H:%M}" if minutes else ""
    return format_html(
        '<svg class="outbox-chart" role="img" viewBox="0 0 {w} {h}" width="{w}" height="{h}"'
        ' xmlns="http://www.w3.org/2000/svg" aria-labelledby="outbox-chart-title">'
        '<title id="outbox-chart-title">Delivered and failed attempts per minute, last {n} minutes'
        " ({delivered} delivered, {failed} failed)</title>"
        "{grid}{bars}"
        '<line x1="{left}" x2="{right}" y1="{base}" y2="{base}" stroke="#888"/>'
        '<text x="{left}" y="{label_y}" font-size="11" fill="#666">{first} UTC</text>'
        '<text x="{right}" y="{label_y}" font-size="11" fill="#666" text-anchor="end">{last} UTC</text>'
        "</svg>",
        w=WIDTH,
        h=HEIGHT,
        n=len(minutes),
        delivered=sum(m.delivered for m in minutes),
        failed=sum(m.failed for m in minutes),
        grid=grid,
        bars=bar_html,
        left=LEFT,
        right=WIDTH - RIGHT,
        base=TOP + plot_h,
        label_y=HEIGHT - 8,
        first=first,
        last=last,
    )
