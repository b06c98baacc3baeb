"""The overview's samples and charts without a browser: rates between samples (a counter that
went down, as when a node restarts, is never a negative rate), the JSON kept in Redis, and the
SVG geometry (points inside the box, the newest at the right edge, old points left out)."""

from __future__ import annotations

from services.console.chart import HEIGHT, WIDTH, chart, nice_ceiling
from services.console.series import (
    ClusterSample,
    Counts,
    InstanceHealth,
    decode_cluster,
    encode_cluster,
    node_points,
    rates,
)


def test_rates_are_per_second_and_never_negative() -> None:
    points = [
        (0, Counts(messages_in=100, messages_out=50, dropped=0)),
        (10_000, Counts(messages_in=200, messages_out=50, dropped=5)),
        (20_000, Counts(messages_in=30, messages_out=80, dropped=5)),  # a node restarted
    ]
    first, second = rates(points)
    assert (first.messages_in, first.messages_out, first.dropped) == (10.0, 0.0, 0.5)
    assert (second.at_ms, second.messages_in, second.messages_out) == (20_000, 0.0, 3.0)


def test_a_cluster_sample_survives_its_json() -> None:
    sample = ClusterSample(
        at_ms=1234,
        nodes_reporting=2,
        totals=Counts(connections=3, messages_in=9, sessions=1),
        instances=(
            InstanceHealth(
                name="connection-0",
                service="connection",
                status="SERVING",
                counts=Counts(connections=3),
            ),
            InstanceHealth(name="router-0", service="router", status="UNREACHABLE"),
        ),
    )
    assert decode_cluster(encode_cluster(sample)) == sample
    assert node_points([sample], "connection-0") == [(1234, Counts(connections=3))]
    assert node_points([sample], "router-0") == []


def test_chart_points_fit_the_box_and_old_ones_are_left_out() -> None:
    now = 3_600_000
    c = chart(
        chart_id="x",
        title="Messages per second",
        unit="msg/s",
        series=[("in", [(-5_000, 99.0), (0, 0.0), (1_800_000, 7.0), (now, 3.0)])],
        now_ms=now,
        span_s=3600,
    )
    [line] = c.lines
    xy = [tuple(map(float, p.split(","))) for p in line.points.split()]
    assert len(xy) == 3  # the point before the hour is not drawn, nor counted in the scale
    assert c.y_max == 10.0 and line.latest == 3.0
    assert all(0 <= x <= WIDTH and 0 <= y <= HEIGHT for x, y in xy)
    assert xy[0] == (0.0, HEIGHT) and xy[-1][0] == WIDTH
    assert "in 3 msg/s" in c.summary
    empty = chart(chart_id="e", title="Drops", unit="", series=[("d", [])], now_ms=now, span_s=60)
    assert empty.empty and "no samples yet" in empty.summary


def test_the_scale_is_a_round_number() -> None:
    assert [nice_ceiling(v) for v in (0, 0.4, 1, 1.2, 3, 7, 11, 240, 2600)] == [
        1,
        1,
        1,
        2,
        5,
        10,
        20,
        250,
        5000,
    ]
