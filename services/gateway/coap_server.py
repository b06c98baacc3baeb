"""The CoAP listener (aiocoap, RFC 7252 over UDP): the only code that speaks aiocoap. Each
request becomes a `CoapRequest` for coap_gateway.py and its `CoapAnswer` a CoAP response;
an observation becomes a stream of notifications, one per message, confirmable when the
message's QoS (capped by the observation's) is 1 or more, until the client cancels (aiocoap
cancels the render task) or its client goes (a kick, a deleted connection).

DTLS: aiocoap's DTLS server transport needs the DTLSSocket package and is marked
experimental there, so the gateway serves plain CoAP; put a DTLS-terminating proxy in front
where the network is not trusted (docs/gateway.md).
"""

from __future__ import annotations

import contextlib
import logging

import aiocoap
from aiocoap import interfaces

from services.gateway.coap_gateway import CoapAnswer, CoapGateway, CoapRequest, Observation
from services.gateway.stats import GatewayStats

log = logging.getLogger("starling.gateway.coap")

_CODES = {
    400: aiocoap.Code.BAD_REQUEST,
    401: aiocoap.Code.UNAUTHORIZED,
    403: aiocoap.Code.FORBIDDEN,
    404: aiocoap.Code.NOT_FOUND,
    405: aiocoap.Code.METHOD_NOT_ALLOWED,
    413: aiocoap.Code.REQUEST_ENTITY_TOO_LARGE,
    429: aiocoap.Code.TOO_MANY_REQUESTS,
    503: aiocoap.Code.SERVICE_UNAVAILABLE,
}
_OBSERVE_MAX = 1 << 24  # the Observe option's sequence numbers are 24 bits


class CoapSite(interfaces.Resource):
    """The root of the CoAP server: every path comes here."""

    def __init__(self, *, gateway: CoapGateway, stats: GatewayStats) -> None:
        self._gateway = gateway
        self._stats = stats

    async def needs_blockwise_assembly(self, request: aiocoap.Message) -> bool:
        return False

    async def render(self, request: aiocoap.Message) -> aiocoap.Message:
        raise NotImplementedError("render_to_pipe serves every request")

    async def render_to_pipe(self, pipe: object) -> None:
        request: aiocoap.Message = pipe.request  # type: ignore[attr-defined]
        req = _request(request)
        if req.method == "GET" and req.observe == 0:
            await self._observe(pipe, req)
            return
        if req.method == "GET":
            answer = CoapAnswer(405, b"GET /ps/{topic} needs Observe 0 (a subscription)")
        else:
            answer = await self._gateway.request(req)
        pipe.add_response(_response(answer, req.method), is_last=True)  # type: ignore[attr-defined]

    async def _observe(self, pipe: object, req: CoapRequest) -> None:
        got = await self._gateway.observe(req)
        if isinstance(got, CoapAnswer):
            pipe.add_response(_response(got, req.method), is_last=True)  # type: ignore[attr-defined]
            return
        close = got.observer.close
        got.client.on_close.append(close)
        try:
            await self._notify(pipe, got)
        finally:
            with contextlib.suppress(ValueError):
                got.client.on_close.remove(close)
            await self._gateway.unobserve(got)

    async def _notify(self, pipe: object, got: Observation) -> None:
        add = pipe.add_response  # type: ignore[attr-defined]
        add(aiocoap.Message(code=aiocoap.Code.CONTENT, payload=b"", observe=0), is_last=False)
        seq = 0
        observer = got.observer
        for m in got.retained:
            seq += 1
            add(self._note(m.tenant, m.topic, m.payload, min(m.qos, observer.qos), seq), False)
        while True:
            env = await observer.queue.get()
            if env is None:  # its client went
                gone = aiocoap.Message(code=aiocoap.Code.SERVICE_UNAVAILABLE, payload=b"gone")
                add(gone, is_last=True)
                return
            seq = (seq + 1) % _OBSERVE_MAX
            qos = min(env.qos, observer.qos)
            add(self._note(env.tenant, env.topic, env.payload, qos, seq), is_last=False)

    def _note(self, tenant: str, topic: str, payload: bytes, qos: int, seq: int) -> aiocoap.Message:
        """One notification: confirmable at QoS >= 1."""
        self._stats.delivered(tenant, qos, topic, payload)
        return aiocoap.Message(
            code=aiocoap.Code.CONTENT,
            payload=payload,
            observe=seq,
            transport_tuning=aiocoap.Reliable if qos else aiocoap.Unreliable,
        )


def _request(m: aiocoap.Message) -> CoapRequest:
    remote = m.remote
    address = getattr(remote, "sockaddr", None)  # not `hostinfo`: it formats the address
    return CoapRequest(
        method=str(m.code),
        path=tuple(m.opt.uri_path),
        query=tuple(m.opt.uri_query),
        payload=bytes(m.payload),
        observe=m.opt.observe,
        address=str(address[0]) if address else str(getattr(remote, "hostinfo", "")),
    )


def _response(answer: CoapAnswer, method: str) -> aiocoap.Message:
    if answer.status == 200:
        if answer.created:
            code = aiocoap.Code.CREATED
        elif answer.deleted:
            code = aiocoap.Code.DELETED
        else:
            code = aiocoap.Code.CONTENT if method == "GET" else aiocoap.Code.CHANGED
    else:
        code = _CODES.get(answer.status, aiocoap.Code.INTERNAL_SERVER_ERROR)
    message = aiocoap.Message(code=code, payload=answer.payload)
    if answer.max_age_s is not None and answer.status == 429:
        message.opt.max_age = answer.max_age_s
    return message


async def start_coap(site: CoapSite, host: str, port: int) -> aiocoap.Context:
    """The CoAP server on UDP `host:port`; `await context.shutdown()` stops it. UDP only:
    aiocoap's defaults would also open CoAP over TCP, TLS and WebSockets on ports of their
    own, which nothing here bounds or documents."""
    context = await aiocoap.Context.create_server_context(
        site, bind=(host, port), transports=["udp6"]
    )
    log.info("coap_listening", extra={"host": host, "port": port})
    return context
