"""Tenant report (placeholder until the usage table lands)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analytics.jobs.context import JobContext

HELP = "per tenant and hour usage figures -> Parquet and an HTML report with charts"


def add_arguments(p: argparse.ArgumentParser) -> None:
    return None


def run(ctx: JobContext, args: argparse.Namespace) -> dict[str, Any]:
    raise NotImplementedError
