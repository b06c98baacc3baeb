"""What a job runs with: its SparkSession, the store, the settings and its output folder."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from analytics.config import AnalyticsSettings
from analytics.source import StoreConf, read

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass
class JobContext:
    spark: SparkSession
    store: StoreConf
    settings: AnalyticsSettings
    output_dir: Path  # this job's own folder under analytics_output_dir

    def table(self, name: str, columns: Sequence[str] = ()) -> DataFrame:
        """A store table through format `starling`, split as configured."""
        return read(
            self.spark,
            self.store,
            name,
            partitions=self.settings.analytics_partitions or None,
            columns=columns,
        )
