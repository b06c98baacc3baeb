"""Settings of the analytics jobs (env `STARLING_*`, TOML table `[analytics]`): where Spark
runs, how scans are split and where outputs go. The store itself comes from the settings
every service shares (data_dir, cassandra_*); data_dir is the store folder, `data` in the
mesh folder that `starling up --data-dir` and `starling analytics --data-dir` name."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, ValidationError

from services.common.config import ENV_PREFIX, ConfigError, ServiceSettings


class AnalyticsSettings(ServiceSettings):
    service_name: ClassVar[str] = "analytics"
    spark_master: str = Field(
        default="local[*]",
        description="Spark master URL of the analytics jobs (`local[N]`, `spark://host:7077`, "
        "`k8s://...`); `local[*]` runs Spark inside the job's process on every core.",
    )
    analytics_partitions: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description="Input partitions per table scan; 0: 1 + 2 x Spark's default parallelism.",
    )
    analytics_output_dir: Path | None = Field(
        default=None,
        description="Where jobs write their outputs (Parquet, HTML report, run summaries); "
        "unset: `analytics` in the mesh folder, beside the store folder data_dir "
        "(`starling analytics --data-dir D` writes to D/analytics).",
    )
    analytics_delete_batch: int = Field(
        default=500,
        ge=1,
        le=100_000,
        description="Candidate keys per conditional-delete transaction of queue compaction "
        "(each batch holds the store's write lock once).",
    )


def output_dir(settings: AnalyticsSettings) -> Path:
    """The jobs' output folder: the setting, or `analytics` beside the store folder."""
    if settings.analytics_output_dir is not None:
        return Path(settings.analytics_output_dir)
    return Path(settings.data_dir).resolve().parent / "analytics"


def load_analytics_settings(**overrides: Any) -> AnalyticsSettings:
    """Build and validate the settings; `ConfigError` naming the first bad setting. Unlike the
    services' loader it does not require the admin token: the jobs serve no admin API."""
    try:
        return AnalyticsSettings(**overrides)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = ".".join(str(p) for p in err["loc"]) or "?"
        raise ConfigError(
            f"invalid setting {name} ({ENV_PREFIX}{name.upper()}): {err['msg']} "
            f"(got {err.get('input')!r})"
        ) from None
