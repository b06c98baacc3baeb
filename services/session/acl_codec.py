"""The one conversion between an ACL rule (services/common/acl.py) and its protobuf, used by
the session service's servicers and by its clients (CONNECT answers, the admin API)."""

from __future__ import annotations

from services.common.acl import Access, AclRule
from starling.session.v1 import session_pb2 as pb


def rule_to_pb(r: AclRule) -> pb.AclRule:
    return pb.AclRule(
        permission=pb.PERMISSION_ALLOW if r.allow else pb.PERMISSION_DENY,
        action=pb.AclAction.ValueType(r.access),  # Access and AclAction share their values
        topic_filter=r.topic_filter,
        username=r.username,
        client_id=r.client_id,
    )


def rule_from_pb(r: pb.AclRule) -> AclRule:
    """Raises ValueError for an unspecified action (the servicer checks requests first)."""
    return AclRule(
        r.permission == pb.PERMISSION_ALLOW,
        Access(r.action),
        r.topic_filter,
        r.username,
        r.client_id,
    )
