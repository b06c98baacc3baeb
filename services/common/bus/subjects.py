"""Every NATS subject name Starling uses, built in one place.

Topic subjects (`mq.*`, `mqd.*`) come from `services.common.topics.subject`; this module adds
the control, service and event subjects.
"""

from __future__ import annotations

from services.common.topics.subject import escape_token, filter_to_subjects, topic_to_subject

EVENTS_STREAM = "EVENTS"
NODE_HEARTBEATS = "hb.node.*"
NODE_HELLOS = "hello.node.*"
EVENTS_WILDCARD = "ev.>"
# To every connection node: the session registry was lost, re-assert your connections
# (payload: the registry's new generation).
REGISTRY_LOST = "ctl.nodes.reassert"
# A user or an ACL changed: every session service instance drops its in-process copy.
AUTH_CHANGED = "ctl.session.changed"
# From the quota service: a tenant's (or user's) limits changed (payload: the tenant), and the
# ban list changed (payload: the whole list, a ListBansResponse).
QUOTA_LIMITS_CHANGED = "ctl.quota.limits"
QUOTA_BANS_CHANGED = "ctl.quota.bans"
# Every queue instance's held bytes per tenant (a starling.queue.v1.QueuedBytes), for the
# tenants' max_queued_bytes (services/queue/depths.py).
QUEUED_BYTES = "ctl.queue.bytes"


def node_control(node_id: str) -> str:
    """Kick and other commands for one connection node."""
    return f"ctl.node.{escape_token(node_id)}"


def event(tenant: str, event_type: str) -> str:
    """`ev.<tenant>.<type>` on the EVENTS stream."""
    return f"ev.{escape_token(tenant)}.{event_type}"


def node_heartbeat(node_id: str) -> str:
    """A connection node says it is alive (payload: its node id)."""
    return f"hb.node.{escape_token(node_id)}"


def node_hello(node_id: str) -> str:
    """A connection node started (payload: its node id); what it held before is gone."""
    return f"hello.node.{escape_token(node_id)}"


# Rules (services/rules): the durable stream nodes feed with the messages of tenants that have
# rules (`rl.<tenant>`), the rule filters every node holds (request: all tenants' snapshot;
# push: one tenant's full set after a change, also heard by every rules instance).
RULES_STREAM = "RULES"
RULES_WILDCARD = "rl.>"
RULE_FILTERS_REQUEST = "svc.rules.filters"
RULE_FILTERS_CHANGED = "ctl.rules.filters"


def rules_stream(tenant: str) -> str:
    """`rl.<tenant>`: a tenant's messages for its rules, on the RULES stream."""
    return f"rl.{escape_token(tenant)}"


ROUTE_LISTING = "rt.list"  # request: tenant name; every node replies with its filters
ROUTE_CHANGES = "rt.routes.*"  # every tenant's RouteChange events
# Mesh interest per tenant (services/connection/interest.py): announcements, full states and
# each node's ticks to itself.
MESH_INTEREST_ALL = "mi.>"
MESH_INTEREST_ADD = "mi.add"
MESH_INTEREST_STATE = "mi.state"
MESH_INTEREST_TICK_PREFIX = "mi.tick."


def mesh_interest_tick(node_id: str) -> str:
    return MESH_INTEREST_TICK_PREFIX + escape_token(node_id)


def route_changes(tenant: str) -> str:
    """The router's RouteChange events for one tenant's persistent route table."""
    return f"rt.routes.{escape_token(tenant)}"


def queue_notice(tenant: str, queue_id: str) -> str:
    """New entries in a session queue: the node holding the session reads them."""
    return f"qn.{escape_token(tenant)}.{escape_token(queue_id)}"


def shared_group(tenant: str, group: str) -> str:
    """NATS queue group for `$share/<group>/...` members of a tenant."""
    return f"share.{escape_token(tenant)}.{escape_token(group)}"


__all__ = [
    "EVENTS_STREAM",
    "EVENTS_WILDCARD",
    "MESH_INTEREST_ADD",
    "MESH_INTEREST_ALL",
    "MESH_INTEREST_STATE",
    "MESH_INTEREST_TICK_PREFIX",
    "QUOTA_BANS_CHANGED",
    "QUOTA_LIMITS_CHANGED",
    "REGISTRY_LOST",
    "ROUTE_CHANGES",
    "event",
    "filter_to_subjects",
    "mesh_interest_tick",
    "node_control",
    "node_heartbeat",
    "node_hello",
    "queue_notice",
    "route_changes",
    "shared_group",
    "topic_to_subject",
]
