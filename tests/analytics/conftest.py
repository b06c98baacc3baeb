"""A local SparkSession shared by the analytics tests (two cores, few shuffle partitions, no
UI), with format `starling` registered."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from analytics.spark import session

    s = session("local[2]", app="starling-tests", shuffle=4)
    yield s
    s.stop()
