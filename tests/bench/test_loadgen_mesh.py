"""The load generator's closed loop and connection-rate scenario against a real node: the
window really bounds what is in flight, every QoS 1 delivery is acknowledged (no stall), and
the connection count is of CONNACKs that accepted."""

from __future__ import annotations

import pytest

from bench import loadgen
from tests.conftest import MeshInfo

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("qos", [0, 1])
async def test_closed_loop_keeps_the_window_and_loses_nothing(mesh: MeshInfo, qos: int) -> None:
    r = await loadgen.throughput(
        mesh.node(0),
        8,
        8,
        "pairs",
        qos,
        seconds=0.5,
        window=16,
        cpu_pids=[mesh.mesh.by_name("connection-0").pid],
    )
    assert r.received > 0
    assert r.stalls == 0
    assert 0 < r.max_in_flight <= 16
    assert len(r.cpu_s) == 1 and r.cpu_s[0] > 0  # the node did the work, and it was counted


async def test_closed_loop_needs_pairs(mesh: MeshInfo) -> None:
    with pytest.raises(ValueError, match="pairs"):
        await loadgen.throughput(mesh.node(0), 8, 1, "fan-in", 0, seconds=0.1, window=16)


async def test_connect_rate_counts_accepted_connacks_and_keeps_clients_open(
    mesh: MeshInfo,
) -> None:
    cr = await loadgen.connect_rate(mesh.node(0), 150, outstanding=8)
    try:
        assert (cr.attempted, cr.connected) == (150, 150)
        assert cr.seconds > 0 and cr.rate > 0
        assert all(not c.transport.is_closing() for c in cr.clients)  # type: ignore[union-attr]
    finally:
        cr.close()
    assert not cr.clients
