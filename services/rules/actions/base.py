"""The contract between the rules engine (part A: SQL, matching, stream consumption) and its
actions (part B): what one rule result looks like (`Output`), what an action does with a batch
of them (`Action`), how actions publish back into the mesh (`Republisher`), and what an action
may use from its host (`ActionContext`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient


@dataclass(slots=True)
class Output:
    """One rule result for one message: what every action consumes. Not frozen: one is built
    per rule per message, and a frozen dataclass's __init__ costs twice as much; nothing
    changes an output once built."""

    tenant: str
    rule_id: str
    topic: str  # the source message's topic (or `$events/...` for client events)
    columns: dict[str, Any]  # the SELECT's columns, by output name
    payload: bytes  # the columns as JSON (or the raw payload for `SELECT payload` alone)
    qos: int
    message_id: str  # stable id of the source message: sinks may dedupe on it (at-least-once)
    published_at_ms: int
    user_properties: tuple[tuple[str, str], ...] = ()
    clientid: str = ""  # the publishing client's id (templates' `${clientid}`)


@runtime_checkable
class Action(Protocol):
    """One configured action of one rule. `send` returns once every output is accepted by the
    target (acked/confirmed where the target can) and raises on any failure: retries and dead
    letters are the `Delivery`'s job, not the action's."""

    async def start(self) -> None: ...

    async def send(self, outputs: Sequence[Output]) -> None: ...

    async def close(self) -> None: ...


class PermanentActionError(Exception):
    """A failure that retrying cannot fix (an HTTP 4xx, a rejected message): the delivery sends
    the outputs to the dead-letter store at once instead of retrying."""


class Republished(NamedTuple):
    """One message an action publishes into the mesh."""

    tenant: str
    topic: str
    payload: bytes
    qos: int
    retain: bool
    user_properties: tuple[tuple[str, str], ...]


class Republisher(Protocol):
    """Publishes into the mesh like a connection node does (services/rules/republisher.py).
    `publish_many` returns once every message was kept (as `publish` for one): a batch costs
    one router round trip, not one per message."""

    async def publish_many(self, messages: Sequence[Republished]) -> None: ...

    async def publish(
        self,
        tenant: str,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        user_properties: tuple[tuple[str, str], ...],
    ) -> None: ...


@dataclass
class ActionContext:
    """What the rules service lends its actions. `tenant`/`rule_id` name the owner so sources
    (bridge in) and per-rule state are attributed; `nats` is the service's connection (None
    where there is no bus, e.g. `rules test`)."""

    republisher: Republisher
    nats: NatsClient | None
    data_dir: Path
    tenant: str = ""
    rule_id: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


class Source(Protocol):
    """A long-running producer of messages into the mesh (MQTT bridge in)."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...
