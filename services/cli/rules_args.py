"""The arguments of `starling rules ...` (a tenant's rules, their dead letters) and `starling
autosub ...` (its auto-subscriptions). Argparse only: the calls are services/cli/rules.py's,
imported when one of these commands runs (it loads gRPC and the rules API's messages)."""

from __future__ import annotations

from typing import Any

from services.cli.admin_args import add_common_options, page_limit


def _rule_command(commands: Any, name: str, help_: str, rule_id: bool = True) -> Any:
    p = commands.add_parser(name, help=help_)
    add_common_options(p)
    p.add_argument("--rules-addr", help="rules service gRPC address")
    p.add_argument("--tenant", default="default")
    if rule_id:
        p.add_argument("rule_id", help="the rule's id (letters, digits, _ . -)")
    return p


def add_rules_commands(sub: Any) -> None:
    """Register `starling rules ...` on the CLI's subparsers."""
    rules = sub.add_parser("rules", help="SQL rules over a tenant's messages, their dead letters")
    commands = rules.add_subparsers(dest="rules_command", required=True)
    p = _rule_command(commands, "create", "create a rule (refused with the SQL error position)")
    sql = p.add_mutually_exclusive_group(required=True)
    sql.add_argument("--sql", help='SELECT ... FROM "topic/#" [WHERE ...]')
    sql.add_argument("--sql-file", help="file holding the SQL")
    p.add_argument(
        "--action",
        action="append",
        help='an action as JSON: {"kind": "republish", "params": {"topic": "out/${topic}"}} '
        "(repeatable, in order)",
    )
    p.add_argument("--actions-file", help="file holding a JSON list of such actions")
    p.add_argument("--disabled", action="store_true", help="store it disabled")
    p.add_argument("--description", default="")
    _rule_command(commands, "list", "a tenant's rules", rule_id=False)
    _rule_command(commands, "show", "a rule with its metrics over every rules instance")
    _rule_command(commands, "enable", "run a rule again")
    _rule_command(commands, "disable", "stop a rule (kept, with its dead letters)")
    _rule_command(commands, "delete", "delete a rule")
    p = _rule_command(commands, "test", "run SQL against a sample message", rule_id=False)
    p.add_argument("--rule-id", help="a stored rule's SQL (else --sql/--sql-file)")
    p.add_argument("--sql")
    p.add_argument("--sql-file")
    p.add_argument("--topic", required=True)
    p.add_argument("--payload", help="the sample payload as text")
    p.add_argument("--payload-file", help="the sample payload from a file (binary allowed)")
    p.add_argument("--qos", type=int, default=0, choices=[0, 1, 2])
    p.add_argument("--retain", action="store_true")
    p.add_argument("--client-id", default="")
    p.add_argument("--username", default="")
    p.add_argument("--user-property", action="append", help="name=value (repeatable)")
    dlq = commands.add_parser("dlq", help="a rule's dead letters: list, replay, purge")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True)
    p = _rule_command(dlq_commands, "list", "dead letters, oldest first")
    p.add_argument("--after", type=int, default=0, help="only ids above this (paging)")
    p.add_argument("--limit", type=page_limit, default=100)
    p = _rule_command(dlq_commands, "replay", "hand dead letters back to the rule's actions")
    p.add_argument("--ids", type=int, nargs="*", help="these letters only (default: all)")
    _rule_command(dlq_commands, "purge", "delete every dead letter of the rule")


def add_autosub_commands(sub: Any) -> None:
    """Register `starling autosub ...` on the CLI's subparsers."""
    autosub = sub.add_parser(
        "autosub", help="topic filters every client of a tenant is subscribed to at connect"
    )
    commands = autosub.add_subparsers(dest="autosub_command", required=True)
    _rule_command(commands, "list", "a tenant's auto-subscriptions", rule_id=False)
    p = _rule_command(commands, "add", "add one (or set its QoS)", rule_id=False)
    p.add_argument("filter", help="topic filter; %%c = client id, %%u = user name, %%%% = %%")
    p.add_argument("--qos", type=int, default=0, choices=[0, 1, 2])
    p = _rule_command(commands, "delete", "remove one", rule_id=False)
    p.add_argument("filter")
