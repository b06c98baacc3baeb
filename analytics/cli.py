"""`starling analytics JOB [options]`: builds the settings, the SparkSession (local mode by
default, `--master` or the spark_master setting otherwise) and runs the job; its summary is
printed as JSON and kept as `<output>/<job>/last-run.json`."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from analytics.jobs import JOBS


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
        jp.add_argument("--data-dir", help="embedded store folder (default: setting data_dir)")
        jp.add_argument("--output", help="output folder (default: analytics_output_dir)")
        if hasattr(mod, "add_arguments"):
            mod.add_arguments(jp)


def run_analytics(args: argparse.Namespace) -> int:
    from analytics.config import load_analytics_settings
    from analytics.jobs.context import JobContext
    from analytics.source import store_conf_from_settings
    from analytics.spark import session

    overrides: dict[str, Any] = {}
    if args.data_dir:
        overrides["data_dir"] = Path(args.data_dir)
    if args.output:
        overrides["analytics_output_dir"] = Path(args.output)
    settings = load_analytics_settings(**overrides)
    out = Path(settings.analytics_output_dir) / args.job
    out.mkdir(parents=True, exist_ok=True)
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
        spark.stop()
    text = json.dumps(summary, indent=2, sort_keys=True, default=str)
    (out / "last-run.json").write_text(text + "\n")
    print(text)
    return 0
