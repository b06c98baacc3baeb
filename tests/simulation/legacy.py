"""The queue store as it was before issue 36 (commit ebdabbc), loaded from git for the
simulation to show what it finds there: the module is read with `git show`, never copied
into the tree. None when git or the commit is not available."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

BEFORE = "ebdabbc8bdcd0bd519be49949c86df76a11ce1b4"
PATH = "services/common/store/cassandra_queue.py"
ROOT = Path(__file__).resolve().parents[2]


def load() -> ModuleType | None:
    try:
        text = subprocess.run(
            ["git", "show", f"{BEFORE}:{PATH}"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    spec = importlib.util.spec_from_loader("legacy_cassandra_queue", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    # The store ports it imports have since moved into one module per store: it reads the
    # same names from them (services/common/store/ports_*.py).
    ports = {"services.common.store.ports": _ports_then()}
    saved = {name: sys.modules.get(name) for name in ports}
    sys.modules.update(ports)
    try:
        exec(compile(text, f"{BEFORE[:7]}:{PATH}", "exec"), module.__dict__)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module


def _ports_then() -> ModuleType:
    """One module holding every name of today's store ports, as the old `ports` did."""
    then = ModuleType("services.common.store.ports")
    for part in ("auth", "session", "queue", "router", "rules", "usage", "bans"):
        now = importlib.import_module(f"services.common.store.ports_{part}")
        then.__dict__.update({k: v for k, v in vars(now).items() if not k.startswith("__")})
    return then
