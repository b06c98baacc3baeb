"""The EVENTS stream follows `nats_stream_replicas`: a mesh moved from one NATS server to a
cluster of three gets its existing stream replicated three ways (as the RULES stream is),
keeping the events it holds. Runs against a real cluster of three nats-server processes
(the launcher's, with password-protected routes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.errors import NoRespondersError
from nats.js.errors import NoStreamResponseError, NotFoundError

from services.cli.launcher import Launcher
from services.cli.secrets import load_or_create
from services.cli.status import component_status
from services.common.bus import subjects
from services.common.dependencies import JETSTREAM_UNREACHABLE, wait_for
from services.session.events import EVENTS_MAX_AGE_S, ensure_stream
from tests.poll import eventually


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """URLs (operator user) of a NATS cluster of three, JetStream ready on each."""
    launcher = Launcher(
        data_dir=Path(tmp_path_factory.mktemp("events")), nodes=0, mqtt_port=0, nats_servers=3
    )
    launcher.data_dir.mkdir(parents=True, exist_ok=True)
    launcher.secrets = load_or_create(launcher.data_dir)
    servers = launcher.start_nats()
    try:
        ready = launcher.until(
            lambda: all(component_status(c) == "SERVING" for c in servers),
            30,
            [c.name for c in servers],
        )
        assert ready is None, f"NATS cluster not ready: {ready}"
        password = launcher.secrets.nats["operator"]
        yield [f"nats://operator:{password}@127.0.0.1:{c.port}" for c in servers]
    finally:
        launcher.stop()


async def test_an_existing_stream_gets_the_new_replica_count(cluster: list[str]) -> None:
    nc = await nats.connect(cluster)
    js = nc.jetstream()
    try:
        try:
            await js.delete_stream(subjects.EVENTS_STREAM)
        except NotFoundError:
            pass
        # What a session service of a one-server mesh made, holding events already.
        await js.add_stream(
            name=subjects.EVENTS_STREAM,
            subjects=[subjects.EVENTS_WILDCARD],
            max_age=EVENTS_MAX_AGE_S,
            num_replicas=1,
        )

        # A stream just made in a cluster may not answer on every server yet (its leader
        # is elected, its subjects' interest spreads): poll, as a client would retry.
        async def published(i: int) -> bool:
            try:
                await js.publish(f"ev.t1.connected.{i}", b"e")
            except (NoRespondersError, NoStreamResponseError):  # (JetStream's name for it)
                return False
            return True

        for i in range(5):
            await eventually(lambda i=i: published(i), 20, "the new stream answering", 0.05)

        await ensure_stream(js, 3)

        info = await js.stream_info(subjects.EVENTS_STREAM)
        assert info.config.num_replicas == 3
        assert info.config.max_age == EVENTS_MAX_AGE_S  # the rest as it was

        async def caught_up() -> Any:
            info = await js.stream_info(subjects.EVENTS_STREAM)
            peers = info.cluster.replicas if info.cluster else None
            return info if peers and len(peers) == 2 and all(p.current for p in peers) else None

        # JetStream copies the stream to two more servers.
        info = await eventually(caught_up, 20, "the two replicas caught up", every_s=0.05)
        assert info.state.messages == 5, "the events held before the update are kept"

        await ensure_stream(js, 3)  # already right: nothing changes, nothing fails
        assert (await js.stream_info(subjects.EVENTS_STREAM)).config.num_replicas == 3
    finally:
        await nc.drain()


async def test_a_new_stream_is_made_with_the_replica_count(cluster: list[str]) -> None:
    nc = await nats.connect(cluster)
    js = nc.jetstream()
    try:
        try:
            await js.delete_stream(subjects.EVENTS_STREAM)
        except NotFoundError:
            pass
        # As the session service makes it at start: retried while the cluster cannot place
        # three replicas yet (a peer the meta group still sees offline after the last test's
        # stream moves: "no suitable peers for placement").
        await wait_for("jetstream", lambda: ensure_stream(js, 3), 30, JETSTREAM_UNREACHABLE)
        info = await js.stream_info(subjects.EVENTS_STREAM)
        assert info.config.num_replicas == 3
        assert info.config.subjects == [subjects.EVENTS_WILDCARD]
    finally:
        await nc.drain()
