"""The queue link (services/queue/link.py): calls and pushed notices on a node's own TCP
connection to a queue instance, and NATS whenever the link cannot take them. First the
transport alone (real sockets), then a queue service in this process with a client that
follows its ownership announcements, as a connection node's does."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from services.common.bus import subjects
from services.common.bus.client import connect
from services.common.bus.unary import ReplyTooLargeError
from services.common.rpc.errors import InvalidArgumentError, ServiceError, UnavailableError
from services.queue.client import NewEntry, Notice, QueueClient, parse_notice
from services.queue.config import QueueSettings
from services.queue.link import MAX_IN_FLIGHT, LinkServer
from services.queue.link_client import LinkDownError, LinkLostError, QueueLink
from services.queue.main import QueueService
from starling.common.v1.message_pb2 import Publisher, RoutedMessage
from tests.inproc import serving
from tests.poll import eventually, holds_within_async

SECRET = "s3cret"
MAX_FRAME = 4096


class Echo:
    """Handlers of a link server: method 1 echoes, 2 refuses, 3 answers too much, 4 waits."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self.waiting = 0

    async def echo(self, data: bytes) -> bytes:
        self.calls += 1
        return data[::-1]

    async def refuse(self, data: bytes) -> bytes:
        self.calls += 1
        raise InvalidArgumentError("not that one")

    async def huge(self, data: bytes) -> bytes:
        self.calls += 1
        return b"x" * MAX_FRAME

    async def slow(self, data: bytes) -> bytes:
        self.calls += 1
        self.waiting += 1
        await self.release.wait()
        return data

    def handlers(self) -> dict[int, object]:
        return {1: self.echo, 2: self.refuse, 3: self.huge, 4: self.slow}


@pytest.fixture
async def served() -> AsyncIterator[tuple[LinkServer, Echo]]:
    echo = Echo()
    server = LinkServer(echo.handlers(), SECRET, MAX_FRAME)  # type: ignore[arg-type]
    await server.start("127.0.0.1", 0)
    yield server, echo
    await server.stop(0.5)


def _link(server: LinkServer, secret: str = SECRET) -> tuple[QueueLink, list[bytes]]:
    notices: list[bytes] = []
    return QueueLink(f"127.0.0.1:{server.port}", secret, MAX_FRAME, notices.append), notices


async def opened(link: QueueLink) -> QueueLink:
    """The link once its connection (opened in the background by a first call, which goes
    another way meanwhile) is up."""
    with pytest.raises(LinkDownError):
        await link.call(1, b"first", 2.0)
    await eventually(lambda: link._transport is not None, 5, "the link open", every_s=0.01)
    return link


@pytest.fixture
async def linked(
    served: tuple[LinkServer, Echo],
) -> AsyncIterator[tuple[LinkServer, Echo, QueueLink, list[bytes]]]:
    """The server, its handlers, and a link to it, open."""
    server, echo = served
    link, notices = _link(server)
    try:
        yield server, echo, await opened(link), notices
    finally:
        echo.release.set()
        link.close()


async def test_calls_replies_errors_and_notices_on_one_connection(
    linked: tuple[LinkServer, Echo, QueueLink, list[bytes]],
) -> None:
    server, echo, link, notices = linked
    assert await link.call(1, b"abc", 2.0) == b"cba"
    answers = await asyncio.gather(*(link.call(1, bytes([i]) * 3, 2.0) for i in range(50)))
    assert answers == [bytes([i]) * 3 for i in range(50)]
    with pytest.raises(InvalidArgumentError, match="not that one"):
        await link.call(2, b"", 2.0)
    with pytest.raises(ReplyTooLargeError):  # the caller asks again over gRPC
        await link.call(3, b"", 2.0)
    with pytest.raises(LinkDownError):  # never sent: it goes over NATS instead
        await link.call(1, b"y" * MAX_FRAME, 2.0)
    (side,) = server.links
    assert side.notice(b"pushed")
    await eventually(lambda: notices, 5, "the notice", every_s=0.01)
    assert notices == [b"pushed"]
    assert len(server.links) == 1  # every call and the notice shared one connection
    assert echo.calls == 53  # the oversized request never reached the server


async def test_calls_past_the_in_flight_bound_wait_in_tcp_and_are_all_answered(
    linked: tuple[LinkServer, Echo, QueueLink, list[bytes]],
) -> None:
    _, echo, link, _ = linked
    calls = [asyncio.ensure_future(link.call(4, b"%d" % i, 10.0)) for i in range(300)]
    await eventually(lambda: echo.waiting >= MAX_IN_FLIGHT, 5, "a full window", every_s=0.01)
    # Must not happen: a call past the bound reaching the server in a short window.
    assert not await holds_within_async(lambda: echo.waiting > MAX_IN_FLIGHT, 0.1)
    assert echo.waiting == MAX_IN_FLIGHT  # the server stopped reading the link
    echo.release.set()
    assert await asyncio.gather(*calls) == [b"%d" % i for i in range(300)]


async def test_a_wrong_secret_gets_no_call_served_and_the_link_is_not_retried_at_once(
    served: tuple[LinkServer, Echo],
) -> None:
    server, echo = served
    link, _ = _link(server, secret="guess")
    try:
        with pytest.raises(LinkDownError):  # opening in the background: this one goes by NATS
            await link.call(1, b"abc", 2.0)
        # Connected, refused at HELLO, closed.
        await eventually(lambda: link._down_until > time.monotonic(), 5, "the link marked down")
        assert link._transport is None
        with pytest.raises(LinkDownError):  # down for a while: the calls go over NATS
            await link.call(1, b"abc", 2.0)
        assert echo.calls == 0
    finally:
        link.close()


async def test_a_call_without_a_reply_in_time_drops_the_link(
    linked: tuple[LinkServer, Echo, QueueLink, list[bytes]],
) -> None:
    """A connection cut without a word (no FIN, no RST) looks like a slow reply: the call
    goes another way, and so do the next ones, instead of each waiting its timeout."""
    _, _, link, _ = linked
    with pytest.raises(LinkLostError):
        await link.call(4, b"x", 0.2)
    with pytest.raises(LinkDownError):
        await link.call(1, b"abc", 2.0)


async def test_a_stopped_server_fails_the_calls_under_way_as_unavailable(
    linked: tuple[LinkServer, Echo, QueueLink, list[bytes]],
) -> None:
    server, echo, link, _ = linked
    under_way = asyncio.ensure_future(link.call(4, b"x", 10.0))
    await eventually(lambda: echo.waiting, 5, "the call at the server", every_s=0.01)
    await server.stop(0.05)
    with pytest.raises(LinkLostError):  # sent again over NATS (every call may repeat)
        await under_way
    assert isinstance(under_way.exception(), UnavailableError)
    with pytest.raises(LinkDownError):
        await link.call(1, b"abc", 2.0)


TENANT = "t"


def _entry(qid: str, topic: str) -> NewEntry:
    msg = RoutedMessage(
        tenant=TENANT,
        topic=topic,
        payload=b"p",
        qos=1,
        publisher=Publisher(client_id="pub", node_id="n1"),
        message_id=f"{topic}-{uuid.uuid4().hex}",
    )
    return NewEntry(qid, msg, 1, False)


def _queue_settings(nats_url: str, redis_url: str, data_dir: Path) -> QueueSettings:
    return QueueSettings(
        nats_url=nats_url,
        redis_url=redis_url,
        queue_lease_key_prefix=f"{uuid.uuid4().hex}:",
        data_dir=data_dir,
        metrics_port=-1,
        node_id="queue-link-test",
        mesh_auth="disabled",
    )


@dataclass(frozen=True, slots=True)
class Notices:
    """The notices pushed to reader "R": those that came on NATS, those on the link."""

    on_nats: list[Notice] = field(default_factory=list)
    on_link: list[Notice] = field(default_factory=list)

    async def nats_notice(self, m: Msg) -> None:
        self.on_nats.append(parse_notice(m.data))


async def _check_the_link_carries_it(
    client: QueueClient, link_server: LinkServer, qid: str, notices: Notices
) -> int:
    """The link opens, takes an append, a read and an ack, and carries the push; returns
    the client's generation once the link opened."""
    before = client.generation
    await client.read(TENANT, qid, 1, 10)  # over NATS: the link opens meanwhile
    await eventually(
        lambda: link_server.links and client.generation > before,
        5,
        "the client opening the announced link",
    )
    # A link that opens (or breaks) moves the client's generation: its readers poll
    # (services/connection/persistence.py `poll_if_due`).
    opened = client.generation
    assert opened > before
    # What a node's NATS user may not do, its link does not do either: an append not
    # checked against a route table's version (the router's svc.queue.append).
    (link,) = client._calls._links.values()
    with pytest.raises(ServiceError, match="no method 1"):
        await link.call(1, b"", 2.0)
    await client.append(TENANT, [_entry(qid, "a1")])
    r = await client.read(TENANT, qid, 1, 100, mark_delivered=True, reader="R")
    assert [e.seq for e in r.entries] == [1]
    await client.append(TENANT, [_entry(qid, "a2")])
    await eventually(lambda: notices.on_link, 5, "a notice on the link", every_s=0.01)
    assert [(n.first_seq, n.pushed) for n in notices.on_link] == [(2, 1)]
    assert all(n.pushed == 0 for n in notices.on_nats)  # the push did not also go on NATS
    await client.ack(TENANT, qid, 2, renew=("R", 10, 2))
    return opened


async def _check_nats_carries_it(
    client: QueueClient, link_server: LinkServer, qid: str, notices: Notices, opened: int
) -> None:
    """The link stops (as when its port is blocked): NATS carries everything."""
    on_nats = notices.on_nats
    await link_server.stop(0.1)
    await eventually(lambda: client.generation > opened, 5, "a broken link moving the generation")
    await client.append(TENANT, [_entry(qid, "a3")])
    await eventually(lambda: any(n.pushed for n in on_nats), 5, "a push over NATS")
    assert [(n.first_seq, n.pushed) for n in on_nats if n.pushed] == [(3, 1)]
    r = await client.read(TENANT, qid, 3, 100, mark_delivered=True, reader="R")
    assert [e.seq for e in r.entries] == [3]


async def test_a_node_client_uses_the_announced_link_and_falls_back_to_nats(
    nats_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Appends, reads and acks of a client that follows the ownership announcements go on
    the instance's link; entries pushed to its reader come on the link, not on NATS. With
    the link gone, the same calls go over NATS, and so do the pushes."""
    settings = _queue_settings(nats_url, redis_url, tmp_path_factory.mktemp("queue-link"))
    service = QueueService(settings)
    async with serving(service) as addr:
        link_server = service._link
        assert link_server is not None
        nc = await connect(nats_url, "link-test")
        client = QueueClient(addr, timeout_s=2.0)
        client.use_bus(nc)
        # Other tests' queue services announce on the same NATS: this client knows this
        # instance only, as a node of its mesh would.
        calls = client._calls
        calls._following = True
        calls.owners.learn(service._parts.announcement())
        qid = f"dev{uuid.uuid4().hex[:6]}#1"
        notices = Notices()
        await nc.subscribe(subjects.queue_notice(TENANT, qid), cb=notices.nats_notice)
        client.listen("R", notices.on_link.append)
        try:
            opened = await _check_the_link_carries_it(client, link_server, qid, notices)
            await _check_nats_carries_it(client, link_server, qid, notices, opened)
        finally:
            client.unlisten("R")
            await client.close()
            await nc.close()
