"""The analytics jobs: `starling analytics JOB` runs JOBS[JOB].

Each value names a module with
- `HELP: str` (one line for `--help`),
- `add_arguments(parser: argparse.ArgumentParser) -> None` (the job's own options),
- `run(ctx: analytics.jobs.context.JobContext, args: argparse.Namespace) -> dict` (does the
  work, returns a JSON-able summary that the runner prints and keeps in the output folder).
A module may instead have `run(spark, settings) -> dict` (the routes snapshot job); the
runner calls whichever form the module has. A module that is not there (a branch without
that job) is left out of the command.
"""

from __future__ import annotations

JOBS: dict[str, str] = {
    "queue-compaction": "analytics.jobs.queue_compaction",
    "tenant-report": "analytics.jobs.tenant_report",
    "routes-snapshot": "analytics.jobs.routes_snapshot",
}
