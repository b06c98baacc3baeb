"""Synchronous admin helpers for tests (session admin API with the test token)."""

from __future__ import annotations

from typing import Any

import grpc

from starling.session.v1 import session_pb2 as pb
from starling.session.v1 import session_pb2_grpc as pb_grpc
from tests.conftest import ADMIN_TOKEN, MeshInfo

MD = [("authorization", f"Bearer {ADMIN_TOKEN}")]


class Admin:
    def __init__(self, mesh: MeshInfo) -> None:
        self.channel = grpc.insecure_channel(mesh.addr("session"))
        self.stub = pb_grpc.SessionAdminServiceStub(self.channel)

    def user(self, tenant: str, username: str, password: str, scheme: str = "") -> None:
        self.stub.CreateUser(
            pb.CreateUserRequest(
                tenant=tenant, username=username, password=password, hash_scheme=scheme
            ),
            metadata=MD,
        )

    def acl(self, tenant: str, *rules: tuple[str, str, str]) -> None:
        perm = {"allow": pb.PERMISSION_ALLOW, "deny": pb.PERMISSION_DENY}
        action = {
            "pub": pb.ACL_ACTION_PUBLISH,
            "sub": pb.ACL_ACTION_SUBSCRIBE,
            "all": pb.ACL_ACTION_ALL,
        }
        self.stub.SetAcl(
            pb.SetAclRequest(
                tenant=tenant,
                rules=[
                    pb.AclRule(permission=perm[p], action=action[a], topic_filter=f)
                    for p, a, f in rules
                ],
            ),
            metadata=MD,
        )

    def call(self, method: str, request: Any) -> Any:
        return getattr(self.stub, method)(request, metadata=MD)
