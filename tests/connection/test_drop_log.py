"""The node's log names the setting behind every delivery a connection dropped: a client
that stops reading loses QoS 1/2 past its window and `max_queued_messages`, and the line
says so (with the numbers), once per scan, and not again while nothing more is dropped."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from services.common.message import Message
from services.connection.channel import ChannelConfig
from services.connection.conn import Conn
from services.connection.drop_log import DropLog
from tests.connection.harness import connected


class _Sink:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


class _Shell:
    def carry_out(self, conn: Conn, actions: list[Any]) -> None:
        pass

    def mark_dirty(self, conn: Conn) -> None:
        pass

    def cleanup(self, conn: Conn) -> object:
        return None

    def sweep_at(self, conn: Conn, at: float) -> None:
        pass


def _behind(window: int, queue: int) -> Conn:
    """A connected MQTT 3.1.1 client (window `v3_inflight`) that acknowledges nothing."""
    config = ChannelConfig(reason_strings=False, v3_inflight=window, max_queued_messages=queue)
    ch, _ = connected(4, config=config)
    return Conn(_Shell(), ch, _Sink())


def _deliver(conn: Conn, n: int, qos: int) -> None:
    msg = Message("t", "a/b", b"x", qos, False)
    for _ in range(n):
        conn.channel.outbound.deliver(msg, qos, False, (), 0.0)


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    lines = [r for r in caplog.records if r.getMessage() == "deliveries_dropped"]
    caplog.clear()
    return lines


def test_a_full_queue_is_logged_with_its_settings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "starling.connection.drops")
    quiet, behind = _behind(4, 3), _behind(4, 3)
    conns = {quiet, behind}
    drops = DropLog(conns)
    _deliver(quiet, 7, 1)  # window and queue: nothing dropped
    _deliver(behind, 10, 1)  # 4 sent, 3 queued, 3 dropped
    assert drops.scan() == 1
    (line,) = _lines(caplog)
    assert (line.client_id, line.tenant, line.dropped) == ("c", "t", 3)  # type: ignore[attr-defined]
    full = line.queue_full  # type: ignore[attr-defined]
    assert full.startswith("3 QoS 1/2") and "max_queued_messages=3" in full, full
    assert "max_queued_bytes=" in full and "(4 unacknowledged)" in full, full

    assert drops.scan() == 0 and not _lines(caplog)  # nothing new: no line
    _deliver(behind, 2, 2)
    assert drops.scan() == 1
    assert [r.dropped for r in _lines(caplog)] == [2]  # type: ignore[attr-defined]

    conns.discard(behind)  # closed: forgotten
    _deliver(behind, 2, 1)  # a closed connection is no longer looked at
    assert drops.scan() == 0 and not _lines(caplog)


def test_qos0_dropped_while_congested_names_the_write_buffer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "starling.connection.drops")
    conn = _behind(4, 3)
    conn.channel.outbound.set_congested(True, 0.0)
    _deliver(conn, 5, 0)
    report = DropLog({conn}).before(lambda: "report")
    assert report() == "report"
    (line,) = _lines(caplog)
    assert line.slow_consumer.startswith("5 QoS 0")  # type: ignore[attr-defined]
    assert "write buffer" in line.slow_consumer  # type: ignore[attr-defined]
    assert not hasattr(line, "queue_full")
