"""Entry point of the `starling` command: the parser of every command, then the one command
argv names.

Each command imports what it needs when it runs, so building the parser stays cheap (`starling
version` and `--help` load no gRPC, NATS, Redis or launcher): the modules imported here hold
arguments only, and `analytics` registers its jobs (their modules load Spark and Arrow) only
when it is the command.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from pathlib import Path
from typing import Any

from services.cli.admin_args import add_admin_commands
from services.cli.profiles import DEVELOPMENT, PROFILES
from services.cli.redis_setup import REDIS_MODES
from services.cli.rules_args import add_autosub_commands, add_rules_commands

SERVICES = ("connection", "session", "router", "queue", "rules", "quota", "metrics")
# What `starling serve` runs: the services and the web console over their admin APIs.
SERVED = (*SERVICES, "console", "gateway")
# `starling analytics`'s help line in `starling --help` (analytics/cli.py registers the same
# when analytics runs; tests/cli/test_cli_lazy.py checks they agree).
ANALYTICS_HELP = "run a Spark job over the store (compaction, reports)"


def _add_up(sub: Any) -> None:
    p = sub.add_parser("up", help="start NATS, Redis and every service locally, supervised")
    p.add_argument("--nodes", type=int, default=1, help="connection nodes (default 1)")
    p.add_argument("--data-dir", default=".starling", help="run and data folder")
    p.add_argument("--mqtt-port", type=int, default=1883, help="node i listens on P+i")
    p.add_argument(
        "--profile",
        choices=PROFILES,
        default=DEVELOPMENT,
        help="settings of the children: development (default: no per-IP cap, no flapping "
        "bans, anonymous clients) or production (the services' defaults, every protection "
        "on); a STARLING_* variable you set wins over either",
    )
    p.add_argument(
        "--node-workers",
        type=int,
        default=1,
        help="processes per node, all on the node's ports (SO_REUSEPORT): one core each "
        "(default 1)",
    )
    p.add_argument(
        "--redis",
        choices=REDIS_MODES,
        default="standalone",
        help="the local Redis: one server (standalone, default), a primary with two replicas "
        "and three Sentinels (sentinel), or a three-primary Redis Cluster (cluster)",
    )
    p.add_argument(
        "--nats",
        type=int,
        default=1,
        metavar="N",
        help="NATS servers (default 1); 3 or more: a cluster whose JetStream streams are "
        "replicated 3 ways",
    )
    for service in SERVICES[1:]:  # the back office (services/cli/launcher.py)
        plural = "queues" if service == "queue" else f"{service}s"
        if service in ("rules", "metrics"):
            plural = service
        p.add_argument(
            f"--{plural}",
            dest=f"instances_{service}",
            type=int,
            default=1,
            metavar="N",
            help=f"{service} service instances (default 1)",
        )


def _add_mesh_commands(sub: Any) -> None:
    p = sub.add_parser("status", help="health of every component of the local mesh")
    p.add_argument("--data-dir", default=".starling")
    p = sub.add_parser(
        "restart",
        help="stop and start one component of a running `starling up` (same ports)",
    )
    p.add_argument("name", help="component name as `starling status` shows it, e.g. rules")
    p.add_argument("--data-dir", default=".starling")
    p.add_argument(
        "--timeout-s", type=float, default=60.0, help="wait this long for SERVING (default 60)"
    )
    p = sub.add_parser(
        "health",
        help="gRPC health of one service process; exit status 0 when SERVING (container "
        "health checks: `python -m services.cli.health` is the same at a fraction of the CPU)",
    )
    from services.cli.health import add_arguments

    add_arguments(p)
    p = sub.add_parser(
        "secrets", help="write a new set of mesh secrets as files (Compose, Kubernetes)"
    )
    p.add_argument("--out", required=True, help="folder for the files (created 0700)")
    p.add_argument(
        "--nats-servers",
        default="nats-1,nats-2,nats-3",
        help="the NATS cluster's servers, host or host:port of their cluster port (6222), "
        "comma-separated: nats.conf gets password-protected routes among them; one or none: "
        "a single server (default: the compose file's nats-1,nats-2,nats-3)",
    )


def command_word(argv: list[str]) -> str:
    """The command argv names ("" for none, as in `starling --help`): the first word that is
    not an option (the top-level parser has no option that takes a value)."""
    return next((a for a in argv if not a.startswith("-")), "")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command. Given the `command` about to run, `analytics` has its
    jobs only if it is that command (elsewhere only its name and help line show); None: the
    complete parser."""
    parser = argparse.ArgumentParser(prog="starling", description="Starling MQTT mesh")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run one service in this process")
    p.add_argument("service", choices=SERVED)
    _add_up(sub)
    _add_mesh_commands(sub)
    add_admin_commands(sub)
    if command is None or command == "analytics":
        from analytics.cli import add_analytics_command

        add_analytics_command(sub)
    else:
        sub.add_parser("analytics", help=ANALYTICS_HELP)
    add_rules_commands(sub)
    add_autosub_commands(sub)
    from services.cli.store_cmd import add_store_command

    add_store_command(sub)
    from services.cli.version_cmd import add_version_command

    add_version_command(sub)
    return parser


def _run_up(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")
    if args.node_workers < 1:
        parser.error("--node-workers must be at least 1")
    instances = {s: getattr(args, f"instances_{s}") for s in SERVICES[1:]}
    for service, count in instances.items():
        if count < 1:
            parser.error(f"{service} instances must be at least 1")
    if args.nats < 1:
        parser.error("--nats must be at least 1")
    from services.cli.up import UpOptions, run_up  # the launcher: once the options are good

    return run_up(
        UpOptions(
            data_dir=Path(args.data_dir),
            nodes=args.nodes,
            mqtt_port=args.mqtt_port,
            node_workers=args.node_workers,
            instances=instances,
            nats_servers=args.nats,
            profile=args.profile,
            redis=args.redis,
        )
    )


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(command_word(argv))
    args = parser.parse_args(argv)
    if args.command == "serve":
        module = importlib.import_module(f"services.{args.service}.main")
        return int(module.main())
    if args.command == "up":
        return _run_up(parser, args)
    # The rest print and end. Piped into `head`, they stop quietly, not with a
    # BrokenPipeError traceback (the signal's disposition is left alone: tests call this
    # in their own process).
    try:
        code = _print_command(args)
        sys.stdout.flush()  # here, so a closed pipe fails inside the `try`
        return code
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe or socket of the command: a real error
        # Nothing more reaches the reader; the flush at exit must not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _stdout_closed() -> bool:
    """Whoever read our stdout pipe has closed it (POLLERR on its write end)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), 0)
        return any(ev & select.POLLERR for _, ev in poll.poll(0))
    except (OSError, ValueError):  # no real file behind stdout
        return False


def _print_command(args: argparse.Namespace) -> int:
    if args.command == "version":
        from services.cli.version_cmd import run_version

        return run_version()
    if args.command == "secrets":
        from services.cli.secrets import MeshSecrets, write_secret_files

        servers = [h.strip() for h in args.nats_servers.split(",") if h.strip()]
        for path in write_secret_files(Path(args.out), MeshSecrets(), nats_servers=servers):
            print(path)
        return 0
    if args.command == "health":
        from services.cli.health import run

        return run(args)
    if args.command == "status":
        from services.cli.status import run_status

        return run_status(Path(args.data_dir))
    if args.command == "restart":
        from services.cli.restart_cmd import run_restart

        return run_restart(Path(args.data_dir), args.name, args.timeout_s)
    if args.command == "store":
        from services.cli.store_cmd import CheckOptions, run_check

        return run_check(
            CheckOptions(
                cassandra=args.cassandra,
                keyspace=args.keyspace,
                consistency=args.consistency,
                verbose=args.verbose,
                contracts=not args.no_contracts,
            )
        )
    if args.command == "analytics":
        from analytics.cli import run_analytics

        return run_analytics(args)
    from services.cli.admin import run_admin

    return run_admin(args)


if __name__ == "__main__":
    sys.exit(main())
