"""The Spark driver JVM the tests start, made cheap to start.

A test's Spark job is small; starting the JVM is most of its cost (about 14 s of CPU on this
2-core machine for the JIT and class loading of a trivial job). The tests' JVMs therefore
compile with C1 only, collect with the serial collector, and map Spark's classes from a
class-data-sharing archive made once per virtual environment (`make test` makes it:
`python -m tests.spark_jvm`): about 5 s of CPU per JVM instead of 14. `use()` sets this for
every JVM the test process and its children start (`PYSPARK_SUBMIT_ARGS`, which PySpark
reads when it launches its JVM; the `starling analytics` commands the tests run inherit it).
A missing or stale archive costs only the sharing: the JVM checks it and runs without it.
Production jobs keep the JVM's defaults (long jobs want the optimising compiler).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ARCHIVE = Path(sys.prefix) / "spark-classes.jsa"  # its classes come from this venv's pyspark
# C1 only and the serial collector; the JVM's own log (archive warnings) off but for errors.
OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xlog:disable -Xlog:all=error:stderr"
_JOB = (
    "from pyspark.sql import SparkSession\n"
    "s = SparkSession.builder.master('local[2]').config('spark.ui.enabled', 'false')"
    ".getOrCreate()\n"
    "s.range(100).selectExpr('id % 7 as k').groupBy('k').count().collect()\n"
    "s.stop()\n"
)


def submit_args(options: str) -> str:
    """PYSPARK_SUBMIT_ARGS giving the driver JVM `options`."""
    return f"--driver-java-options {shlex.quote(options)} pyspark-shell"


def use() -> None:
    """Every Spark JVM this process and its children start uses OPTIONS (and the archive
    when there is one), unless PYSPARK_SUBMIT_ARGS says otherwise already."""
    if "PYSPARK_SUBMIT_ARGS" not in os.environ:
        shared = f" -XX:SharedArchiveFile={ARCHIVE}" if ARCHIVE.exists() else ""
        os.environ["PYSPARK_SUBMIT_ARGS"] = submit_args(OPTIONS + shared)


def make_archive() -> None:
    """Run a small job whose JVM writes the classes it loaded to ARCHIVE (written aside,
    then renamed: a reader never sees half of one)."""
    aside = ARCHIVE.with_suffix(f".{os.getpid()}.tmp")
    dump = submit_args(f"{OPTIONS} -XX:ArchiveClassesAtExit={aside}")
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": dump}
    # The JVM inherits the pipes and writes the archive as it exits; reading them to their
    # end (capture_output) is what waits for it, not the Python child's exit.
    subprocess.run([sys.executable, "-c", _JOB], env=env, check=True, capture_output=True)
    aside.replace(ARCHIVE)


if __name__ == "__main__":
    try:
        make_archive()
    except (OSError, subprocess.CalledProcessError) as exc:  # no Java: the tests skip Spark
        print(f"tests.spark_jvm: no class-data archive ({exc}); Spark starts without it")
