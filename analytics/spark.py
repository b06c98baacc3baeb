"""The SparkSession of an analytics job: local mode by default, a master URL when configured,
with format `starling` registered."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_ROOT = str(Path(__file__).resolve().parent.parent)


def session(
    master: str = "local[*]", app: str = "starling-analytics", shuffle: int = 0
) -> SparkSession:
    """A SparkSession on `master`. Python workers get this checkout on their path (they import
    analytics.source to read) and this interpreter."""
    from pyspark.sql import SparkSession

    from analytics.source import register

    path = os.environ.get("PYTHONPATH", "")
    if _ROOT not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, path) if p)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    )
    if shuffle:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
