"""Every admin servicer refuses a missing or malformed tenant alike (INVALID_ARGUMENT with the
field named): services/common/rpc/arguments.py."""

from __future__ import annotations

import pytest

from services.common.rpc.arguments import required, tenant_argument
from services.common.rpc.errors import InvalidArgumentError


@pytest.mark.parametrize(
    ("value", "words"),
    [("", "tenant is required"), ("a/b", "invalid tenant name"), ("x" * 65, "1-64")],
)
def test_a_bad_tenant_is_refused_with_its_reason(value: str, words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        tenant_argument(value)


def test_a_good_tenant_and_a_present_field_pass() -> None:
    assert tenant_argument("acme_1-b") == "acme_1-b"
    assert required("c1", "client_id") == "c1"
    with pytest.raises(InvalidArgumentError, match="client_id is required"):
        required("", "client_id")
