"""Line charts drawn on the server as inline SVG (templates/chart.html draws a `Chart`): the
geometry only, pure. The x axis ends at `now_ms` and goes back `span_s` seconds, or only to the
oldest sample when sampling began more recently (at least a minute), so a new mesh's charts
are not a sliver at the right edge; the y axis goes from 0 to a round number above the
largest value, so a chart never rescales by a little."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

WIDTH = 600
HEIGHT = 150
MIN_SPAN_S = 60


@dataclass(frozen=True, slots=True, kw_only=True)
class Line:
    label: str
    css: str  # the stroke's CSS class in console.css ("s1", "s2", "s3")
    points: str  # SVG polyline points, "x,y x,y ..."
    latest: float | None  # the newest value (None: no point)


@dataclass(frozen=True, slots=True, kw_only=True)
class Chart:
    chart_id: str
    title: str
    unit: str
    lines: tuple[Line, ...]
    y_max: float
    span_s: int
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def span_label(self) -> str:
        ago = f"{self.span_s // 60} min" if self.span_s >= 120 else f"{self.span_s} s"
        return "\u2212" + ago  # a minus sign, not a hyphen

    @property
    def empty(self) -> bool:
        return all(not line.points for line in self.lines)

    @property
    def summary(self) -> str:
        """What the chart says, for a screen reader: each line's newest value."""
        parts = [
            f"{line.label} {_number(line.latest)}" for line in self.lines if line.latest is not None
        ]
        return f"{self.title}, since {self.span_label}: " + (
            ", ".join(parts) + f" {self.unit}" if parts else "no samples yet"
        )


def _number(v: float) -> str:
    return f"{v:.0f}" if v >= 10 or v == int(v) else f"{v:.1f}"


def nice_ceiling(v: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is >= v (1 for v <= 1)."""
    if v <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(v))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= v:
            return float(step * power)
    return float(10 * power)


def chart(
    *,
    chart_id: str,
    title: str,
    unit: str,
    series: Sequence[tuple[str, Sequence[tuple[int, float]]]],
    now_ms: int,
    span_s: int,
) -> Chart:
    """A chart of `series` ((label, [(at_ms, value), ...]) each, oldest first); points older
    than the span are left out."""
    oldest = min((pts[0][0] for _, pts in series if pts), default=now_ms - span_s * 1000)
    span_s = max(MIN_SPAN_S, min(span_s, math.ceil((now_ms - oldest) / 1000)))
    start_ms = now_ms - span_s * 1000
    shown = [(label, [(t, v) for t, v in pts if start_ms <= t <= now_ms]) for label, pts in series]
    y_max = nice_ceiling(max((v for _, pts in shown for _, v in pts), default=0.0))
    lines = []
    for n, (label, pts) in enumerate(shown):
        xy = [
            (
                (t - start_ms) / (span_s * 1000) * WIDTH,
                HEIGHT - min(v, y_max) / y_max * HEIGHT,
            )
            for t, v in pts
        ]
        lines.append(
            Line(
                label=label,
                css=f"s{n % 3 + 1}",
                points=" ".join(f"{x:.1f},{y:.1f}" for x, y in xy),
                latest=pts[-1][1] if pts else None,
            )
        )
    return Chart(
        chart_id=chart_id, title=title, unit=unit, lines=tuple(lines), y_max=y_max, span_s=span_s
    )
