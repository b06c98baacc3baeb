"""`starling analytics JOB [options]`: builds the settings, the SparkSession (local mode by
default, `--master` or the spark_master setting otherwise) and runs the job; its summary is
printed as JSON and kept as `<output>/<job>/last-run.json`.

`--data-dir D` means what it means to every `starling` command: the mesh folder of
`starling up --data-dir D`. The store is D/data and the outputs go to D/analytics unless
`--output` says otherwise. A folder that holds no store is refused in one line naming the
option, before Spark starts."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from analytics.jobs import JOBS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from analytics.config import AnalyticsSettings


def _module(job: str) -> ModuleType | None:
    try:
        return importlib.import_module(JOBS[job])
    except ModuleNotFoundError as exc:
        if exc.name != JOBS[job]:
            raise
        return None


def add_analytics_command(sub: Any) -> None:
    """The `analytics` subcommand with one sub-subcommand per job."""
    p = sub.add_parser("analytics", help="run a Spark job over the store (compaction, reports)")
    jobs = p.add_subparsers(dest="job", required=True)
    for name in JOBS:
        mod = _module(name)
        if mod is None:
            continue
        doc = (mod.__doc__ or name).strip().splitlines()[0]
        jp = jobs.add_parser(name, help=getattr(mod, "HELP", doc))
        jp.add_argument("--master", help="Spark master URL (default: setting spark_master)")
        jp.add_argument(
            "--data-dir",
            help="the mesh folder, as for `starling up` (its store: D/data; default: the "
            "folder around the data_dir setting, .starling)",
        )
        jp.add_argument(
            "--output",
            help="output folder (default: setting analytics_output_dir, else D/analytics)",
        )
        if hasattr(mod, "add_arguments"):
            mod.add_arguments(jp)


class UsageError(Exception):
    """A command-line mistake, said in one line."""


def _settings(args: argparse.Namespace) -> AnalyticsSettings:
    """The settings with the command line's folders; `UsageError` for a folder with no store
    (the embedded store only: Cassandra needs no folder)."""
    from analytics.config import load_analytics_settings

    overrides: dict[str, Any] = {}
    if args.data_dir:
        overrides["data_dir"] = Path(args.data_dir) / "data"
    if args.output:
        overrides["analytics_output_dir"] = Path(args.output)
    settings = load_analytics_settings(**overrides)
    store = Path(settings.data_dir)
    if settings.cassandra_contact_points or store.is_dir():
        return settings
    if args.data_dir:
        given = Path(args.data_dir)
        hint = "no such folder" if not given.is_dir() else "no store folder data/ in it"
        if any(given.glob("*.db")):
            hint = f"that is a store folder; give the mesh folder around it, {given.parent}"
        raise UsageError(f"--data-dir {given}: {hint} (--data-dir is the mesh folder of "
                         "`starling up --data-dir`)")  # fmt: skip
    raise UsageError(
        f"no store at {store} (setting data_dir, STARLING_DATA_DIR): give the mesh folder "
        "with --data-dir"
    )


def run_analytics(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """Run `args.job` on its own SparkSession, stopped at the end; or on `spark`, left
    running (the tests run the command on their shared session)."""
    from analytics.config import output_dir
    from analytics.jobs.context import JobContext
    from analytics.source import store_conf_from_settings
    from analytics.spark import session

    try:
        settings = _settings(args)
    except UsageError as exc:
        print(f"starling analytics {args.job}: {exc}", file=sys.stderr)
        return 2
    out = output_dir(settings) / args.job
    out.mkdir(parents=True, exist_ok=True)
    own = spark is None
    if spark is None:
        spark = session(args.master or settings.spark_master, app=f"starling-{args.job}")
    try:
        ctx = JobContext(spark, store_conf_from_settings(settings), settings, out)
        started = time.time()
        mod = _module(args.job)
        assert mod is not None  # the parser offered only jobs whose module is there
        if next(iter(inspect.signature(mod.run).parameters)) == "spark":
            summary = mod.run(spark, settings)  # the routes snapshot's form
        else:
            summary = mod.run(ctx, args)
        summary = {"job": args.job, "wall_s": round(time.time() - started, 3), **summary}
    finally:
        if own:
            spark.stop()
    text = json.dumps(summary, indent=2, sort_keys=True, default=str)
    (out / "last-run.json").write_text(text + "\n")
    print(text)
    return 0
