"""Fixtures of the rules tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.rules.webhook import Webhook


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    w = Webhook()
    yield w
    w.close()
