"""A node whose NATS connection is closed for good must not go on as if it could carry
traffic: it sheds its clients (DISCONNECT 0x89), stops listening and reports NOT_SERVING.

Runs a connection service in this process (on the `core` services) so the test can close the
node's bus connection the way nats-py does after a server `-ERR`.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from services.common.mqtt import ConnAck, Connect, Disconnect
from services.connection.config import ConnectionSettings
from services.connection.main import ConnectionService
from tests.e2e.clients import Raw
from tests.inproc import OPEN_TENANT, Core, serving


async def test_node_that_loses_its_bus_sheds_clients_and_stops_serving(
    core: Core, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    settings = ConnectionSettings(
        node_id="bus-loss",
        nats_url=nats_url,
        redis_url=redis_url,
        data_dir=tmp_path,
        metrics_port=-1,
        mqtt_host="127.0.0.1",
        mqtt_port=0,
        session_addr=core.session,
        router_addr=core.router,
        queue_addr=core.queue,
        metrics_addr=core.metrics,
    )
    service = ConnectionService(settings)
    async with serving(service):
        port = service.ports["mqtt"]
        client = await asyncio.to_thread(Raw, port)
        ack = await asyncio.to_thread(
            client.connect,
            Connect(client_id="victim", protocol_level=5, username=f"{OPEN_TENANT}/u"),
        )
        assert isinstance(ack, ConnAck) and ack.reason_code == 0
        assert service.unhealthy is not None and not service.unhealthy.done()

        assert service.node is not None
        await service.node.nc.close()  # what nats-py does after a protocol error

        packet = await asyncio.to_thread(client.recv)
        assert isinstance(packet, Disconnect) and packet.reason_code == 0x89
        assert await asyncio.wait_for(service.unhealthy, 5) == "nats connection closed"
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        client.close()
