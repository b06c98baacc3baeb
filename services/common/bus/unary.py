"""Unary calls over NATS request/reply, for the calls on the persistent publish path and on
the CONNECT path (node -> session service `Connect` and `Disconnect`, node -> router
`SettleWill`: a reconnect storm is thousands of these a second).

Why not gRPC there: on these machines a grpc.aio unary call costs ~0.55 ms and ~600 us of CPU
(client and server together), a NATS request ~0.23 ms and ~180 us (bench figures in
docs/benchmarks.md). A persistent QoS 1 publish makes two calls before its PUBACK (node ->
router, router -> queue), so the hop is most of its latency. The request and reply are the same
protobuf messages as the gRPC methods, and the servers run the same servicer code; gRPC stays
for every other call and for requests too large for one NATS message.

Who may call: the NATS user of each service may publish only to the subjects it needs
(services/cli/secrets.py), which takes the place of the gRPC mesh secret on these subjects.
Errors travel in a reply header (`Starling-Error: <gRPC status name> <details>`) and are raised
as the same `ServiceError` subclasses as a failed gRPC call; no responders or no reply in time
is `UnavailableError`, which callers already retry.
Instances of a service share a subject through a queue group, as gRPC clients would spread over
instances behind one address.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from opentelemetry import context, trace

from services.common.bus.large import limit
from services.common.rpc import red
from services.common.rpc.client import LazyStub
from services.common.rpc.errors import (
    InvalidArgumentError,
    UnavailableError,
    error_for,
    status_for,
)
from services.common.tasks import TaskSet
from services.common.telemetry import extract, inject
from services.common.topics.subject import escape_token

log = logging.getLogger("starling.bus.unary")
_tracer = trace.get_tracer("starling.bus")

ERROR_HEADER = "Starling-Error"
# The reply does not fit one NATS message: the caller asks again over gRPC.
TOO_LARGE = "TOO_LARGE"
ROUTE_SUBJECT = "svc.router.route"
APPEND_SUBJECT = "svc.queue.append"
# Appends chosen by a connection node's copy of the route table (checked against its version).
DIRECT_APPEND_SUBJECT = "svc.queue.direct"
# The router fences a new route table version: every queue instance answers (no queue group).
FENCE_ROUTES_SUBJECT = "svc.queue.routes"
READ_SUBJECT = "svc.queue.read"
ACK_SUBJECT = "svc.queue.ack"
RELEASED_SUBJECT = "svc.queue.released"
# Queue instances announce the partitions they own here (QueueOwners); callers send a queue's
# calls to its owner's own subject (`instance_subject`), the shared ones above when they know
# no owner yet.
QUEUE_OWNERS_SUBJECT = "ctl.queue.owners"
# The CONNECT path: a node's CONNECT(s) and end of connection (`<session_subject>.connect`,
# `.connects`, `.disconnect`; setting `session_subject`, default "svc.session"), and its will
# settlement.
CONNECT_SUFFIX = ".connect"
CONNECT_MANY_SUFFIX = ".connects"  # the CONNECTs of one loop turn of a node
DISCONNECT_SUFFIX = ".disconnect"
SETTLE_WILL_SUBJECT = "svc.router.will"
# Requests one server works on at once; more wait in the subscription's pending buffer (and
# time out there, to be retried, if the service cannot keep up).
MAX_IN_FLIGHT = 256
Handler = Callable[[bytes], Awaitable[bytes]]
M = TypeVar("M", bound=Message)
R = TypeVar("R", bound=Message)


def instance_subject(subject: str, instance_id: str) -> str:
    """The subject of one instance's `subject` calls (`svc.queue.append.<instance>`)."""
    return f"{subject}.{escape_token(instance_id)}"


def parse(cls: type[M], data: bytes) -> M:
    """The request, or INVALID_ARGUMENT for bytes that are not one."""
    try:
        return cls.FromString(data)
    except DecodeError as exc:
        raise InvalidArgumentError(f"malformed {cls.DESCRIPTOR.name}") from exc


class UnaryServer:
    """Serves one subject: each request is `handler(data)`, answered with its bytes."""

    def __init__(self, nc: Client, subject: str, queue: str, handler: Handler) -> None:
        self._nc = nc
        self._subject = subject
        self._queue = queue
        self._handler = handler
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._tasks = TaskSet()
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(
            self._subject,
            queue=self._queue,
            cb=self._on_request,
            pending_msgs_limit=65536,
            pending_bytes_limit=256 << 20,
        )

    async def _on_request(self, msg: Msg) -> None:
        # Waiting for a slot here holds back the subscription's callback: the backlog stays
        # in NATS's pending buffer, bounded, instead of in tasks.
        await self._slots.acquire()
        self._tasks.spawn(self._answer(msg), name=f"unary:{self._subject}")

    async def _answer(self, msg: Msg) -> None:
        started = time.perf_counter()
        outcome = "OK"
        try:
            if msg.headers:  # a traced call: its span continues here
                token = context.attach(extract(msg.headers))
                try:
                    with _tracer.start_as_current_span(self._subject, kind=trace.SpanKind.SERVER):
                        out = await self._handler(msg.data)
                finally:
                    context.detach(token)
            else:
                out = await self._handler(msg.data)
            if len(out) > limit(self._nc):
                await self._nc.publish(msg.reply, b"", headers={ERROR_HEADER: TOO_LARGE})
                return
            await msg.respond(out)
        except Exception as exc:
            code, details = status_for(exc)
            outcome = code.name
            if code == grpc.StatusCode.INTERNAL:
                log.exception("unary_failed", extra={"subject": self._subject})
            if msg.reply:
                try:
                    await self._nc.publish(
                        msg.reply, b"", headers={ERROR_HEADER: f"{code.name} {details}"}
                    )
                except Exception:  # the caller times out and retries
                    log.warning("unary_error_reply_failed", extra={"subject": self._subject})
        finally:
            self._slots.release()
            red.record(self._subject, outcome, time.perf_counter() - started, "nats")

    async def stop(self) -> None:
        """No new requests; the ones under way are answered."""
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # the connection may be closing already
                log.debug("unary_unsubscribe_failed")
        await self._tasks.wait(5.0)


class ReplyTooLargeError(Exception):
    """The answer does not fit one NATS message: ask again by gRPC."""


class UnaryClient:
    """Requests on one NATS connection; `fits` says whether a request may go over NATS."""

    def __init__(self, nc: Client, timeout_s: float) -> None:
        self._nc = nc
        self._timeout_s = timeout_s

    def fits(self, nbytes: int) -> bool:
        return nbytes <= limit(self._nc) and self._nc.is_connected

    async def call(self, subject: str, data: bytes) -> bytes:
        span = trace.get_current_span()
        headers = inject() if span.is_recording() else None
        try:
            msg = await self._nc.request(subject, data, timeout=self._timeout_s, headers=headers)
        except NoRespondersError as exc:
            raise UnavailableError(f"no service answers on {subject}") from exc
        except (NatsTimeoutError, TimeoutError) as exc:
            raise UnavailableError(f"no reply on {subject} in time") from exc
        if msg.headers and ERROR_HEADER in msg.headers:
            if msg.headers[ERROR_HEADER] == TOO_LARGE:
                raise ReplyTooLargeError(subject)
            name, _, details = msg.headers[ERROR_HEADER].partition(" ")
            raise error_for(getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN), details)
        return msg.data

    async def call_all(
        self, subject: str, data: bytes, complete: Callable[[list[bytes]], bool]
    ) -> list[bytes]:
        """A request every server of `subject` answers (they share no queue group): the
        replies, once `complete(replies)` says they are all in; UnavailableError if that
        does not happen in time, or an error reply's ServiceError."""
        replies: list[bytes] = []
        errors: list[Exception] = []
        done = asyncio.Event()

        async def on_reply(msg: Msg) -> None:
            if msg.headers and ERROR_HEADER in msg.headers:
                name, _, details = msg.headers[ERROR_HEADER].partition(" ")
                code = getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN)
                errors.append(error_for(code, details))
                done.set()
                return
            replies.append(msg.data)
            if complete(replies):
                done.set()

        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox, cb=on_reply)
        try:
            await self._nc.publish(subject, data, reply=inbox)
            try:
                await asyncio.wait_for(done.wait(), self._timeout_s)
            except TimeoutError as exc:
                raise UnavailableError(
                    f"{len(replies)} answers on {subject} in time, not all"
                ) from exc
        finally:
            await sub.unsubscribe()
        if errors:
            raise errors[0]
        return replies


async def call(
    bus: UnaryClient | None,
    subject: str,
    rpc: LazyStub[Any],
    method: Callable[..., Awaitable[R]],
    req: Message,
    reply: type[R],
) -> R:
    """`method(req)`: over NATS on `subject` when there is a bus and the request fits one
    NATS message, else (or when the answer did not fit one) over gRPC."""
    if bus is not None:
        data = req.SerializeToString()  # once: ByteSize() would serialize it a second time
        if bus.fits(len(data)):
            try:
                return reply.FromString(await bus.call(subject, data))
            except ReplyTooLargeError:
                pass  # e.g. a queue read whose first entry is larger than a NATS message
    return await rpc.call(method, req)


def servicer_handler(method: Callable[[Any, Any], Awaitable[Message]], request: type[M]) -> Handler:
    """A gRPC servicer method as a handler: the same code serves both transports (the
    servicers of these calls do not use the gRPC context)."""

    async def handle(data: bytes) -> bytes:
        return bytes((await method(parse(request, data), None)).SerializeToString())

    return handle
