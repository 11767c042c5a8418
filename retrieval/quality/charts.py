"""Server-rendered SVG charts of the quality page (no script, no CDN): pass rate over time, failed
queries per day by verdict, the top unanswered clusters. Every text is escaped; each chart is an
``<svg role="img">`` with an ``aria-label`` and a ``<title>`` per mark."""

from __future__ import annotations

from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe

WIDTH, HEIGHT, PAD = 640, 200, 32
VERDICT_COLOURS = {
    "retrieval-miss": "#c0392b",
    "coverage-gap": "#d68910",
    "irrelevant": "#7f8c8d",
    "uncertain": "#2e86c1",
    "untriaged": "#95a5a6",
}


def _svg(label: str, body: str, height: int = HEIGHT) -> str:
    return format_html(
        '<svg role="img" aria-label="{}" viewBox="0 0 {} {}" width="{}" height="{}" '
        'xmlns="http://www.w3.org/2000/svg" class="kfs-chart">{}</svg>',
        label, WIDTH, height, WIDTH, height, mark_safe(body),
    )  # fmt: skip


def _x(n: int, count: int) -> float:
    return PAD + (WIDTH - 2 * PAD) * (n / max(1, count - 1))


def pass_rate_chart(daily: list[dict]) -> str:
    """A line of the daily replay pass rate (0–100 %); days without a finished run are gaps."""
    inner = HEIGHT - 2 * PAD
    parts = [
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" '
        'stroke="#888"/>',
        f'<text x="4" y="{PAD + 4}" font-size="10">100%</text>',
        f'<text x="4" y="{HEIGHT - PAD + 4}" font-size="10">0%</text>',
    ]
    points = []
    for n, day in enumerate(daily):
        if day["pass_rate"] is None:
            continue
        x, y = _x(n, len(daily)), HEIGHT - PAD - inner * day["pass_rate"]
        points.append(f"{x:.1f},{y:.1f}")
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="#1f6feb" class="kfs-point">'
            f"<title>{escape(day['day'])}: {day['pass_rate']:.0%}</title></circle>"
        )
    if len(points) > 1:
        parts.insert(0, f'<polyline fill="none" stroke="#1f6feb" stroke-width="2" '
                        f'points="{" ".join(points)}"/>')  # fmt: skip
    if daily:
        parts.append(f'<text x="{PAD}" y="{HEIGHT - 8}" font-size="10">'
                     f"{escape(daily[0]['day'])}</text>")  # fmt: skip
        parts.append(f'<text x="{WIDTH - PAD - 60}" y="{HEIGHT - 8}" font-size="10">'
                     f"{escape(daily[-1]['day'])}</text>")  # fmt: skip
    if not points:
        parts.append(f'<text x="{WIDTH / 2 - 60}" y="{HEIGHT / 2}" font-size="12">'
                     "no finished replay run</text>")  # fmt: skip
    return _svg("Replay pass rate over time", "".join(parts))


def failed_queries_chart(daily: list[dict]) -> str:
    """Stacked bars: failed queries captured per day, by verdict."""
    inner = HEIGHT - 2 * PAD
    top = max((sum(d["failed_queries"].values()) for d in daily), default=0) or 1
    slot = (WIDTH - 2 * PAD) / max(1, len(daily))
    axis = f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" '
    parts = [axis + 'stroke="#888"/>', f'<text x="4" y="{PAD + 4}" font-size="10">{top}</text>']
    for n, day in enumerate(daily):
        base = HEIGHT - PAD
        for verdict, colour in VERDICT_COLOURS.items():
            count = day["failed_queries"].get(verdict, 0)
            if not count:
                continue
            height = inner * count / top
            base -= height
            parts.append(
                f'<rect class="kfs-bar" data-verdict="{verdict}" x="{PAD + n * slot + 1:.1f}" '
                f'y="{base:.1f}" width="{max(1.0, slot - 2):.1f}" height="{height:.1f}" '
                f'fill="{colour}"><title>{escape(day["day"])}: {count} {verdict}</title></rect>'
            )
    legend = "".join(
        f'<rect x="{PAD + i * 120}" y="4" width="10" height="10" fill="{c}"/>'
        f'<text x="{PAD + i * 120 + 14}" y="13" font-size="10">{v}</text>'
        for i, (v, c) in enumerate(VERDICT_COLOURS.items())
    )
    return _svg("Failed queries per day by verdict", legend + "".join(parts))


def unanswered_chart(top: list[dict]) -> str:
    """Horizontal bars: the largest clusters of unanswered questions."""
    row = 22
    height = max(row * len(top) + 10, 40)
    most = max((t["count"] for t in top), default=1)
    parts = []
    for n, item in enumerate(top):
        y = 5 + n * row
        width = (WIDTH - 330) * item["count"] / most
        label = item["query"] if len(item["query"]) <= 48 else item["query"][:47] + "…"
        parts.append(
            f'<text x="4" y="{y + 14}" font-size="11">{escape(label)}</text>'
            f'<rect class="kfs-cluster" x="320" y="{y}" width="{width:.1f}" height="16" '
            f'fill="#8e44ad"><title>{item["count"]}</title></rect>'
            f'<text x="{324 + width:.1f}" y="{y + 13}" font-size="11">{item["count"]}</text>'
        )
    if not top:
        parts.append('<text x="4" y="24" font-size="12">no unanswered question</text>')
    return _svg("Top unanswered clusters", "".join(parts), height)
