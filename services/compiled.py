"""Which core runs: the sans-I/O hot path compiled with mypyc, or the same modules as Python.

`scripts/build_compiled.py` (run by `make`) compiles `COMPILED_MODULES` into
`<sys.prefix>/compiled/`, outside the source tree, and writes a manifest there: the SHA-256 of
every source the build read, the Python it was built for, and the extension file of each
module. `install()` runs once, when the `services` package is first imported (before anything
can import a compiled module): unless `STARLING_PURE=1`, it checks the manifest against the
sources and puts a finder at the front of `sys.meta_path` that loads those modules' extensions
instead of their .py files. All or nothing: if the build is missing, stale (a source changed
since it was built), made for another Python, or its shared library does not load, every module
runs as Python and one warning says why. `status()` says which core is loaded
(`starling version` prints it).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

# The repository root (or site-packages): the folder that holds services/.
ROOT = Path(__file__).resolve().parent.parent
PURE_ENV = "STARLING_PURE"
DIR_ENV = "STARLING_COMPILED_DIR"
MANIFEST = "manifest.json"
GROUP = "starling_core"
RUNTIME = f"{GROUP}__mypyc"  # mypyc's shared library, which every module's shim loads

_CHANNEL = (
    "acks_owed actions closing config control core delivery_bytes enhanced_auth handshake "
    "hooks inbound opening outbound problems state subscriptions"
)
_SHELL = "fanout ingress mesh publish_answers replica routing stats writes"
# The modules compiled (docs/compiled-core.md says why these and not others).
COMPILED_MODULES: tuple[str, ...] = (
    *(
        f"services.common.mqtt.{name}"
        for name in (
            "body_decoder decoder encoder packets primitives properties property_decoder reason"
        ).split()
    ),
    *(f"services.common.topics.{name}" for name in "rules share trie".split()),
    *(f"services.connection.channel.{name}" for name in _CHANNEL.split()),
    # The node's per-message shell around the channel.
    "services.common.bus.ids",
    "services.common.envelope",
    "services.common.message_size",
    *(f"services.connection.{name}" for name in _SHELL.split()),
)


@dataclass(frozen=True, slots=True)
class CoreStatus:
    """The core this process loaded: compiled from `where`, or pure Python because `reason`."""

    compiled: bool
    where: str = ""
    reason: str = ""

    def describe(self) -> str:
        if self.compiled:
            return f"compiled (mypyc) from {self.where}"
        return f"pure Python ({self.reason})"


def build_dir() -> Path:
    """Where the build lives: beside the interpreter that runs it (the virtualenv), unless
    `STARLING_COMPILED_DIR` names another folder."""
    return Path(os.environ.get(DIR_ENV) or Path(sys.prefix) / "compiled")


def module_file(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".py")


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stale_file(files: dict[str, str]) -> str | None:
    """The first source (relative to ROOT) whose digest differs from the build's, if any."""
    for rel, digest in sorted(files.items()):
        path = ROOT / rel
        if not path.is_file() or file_digest(path) != digest:
            return rel
    return None


def python_tag() -> str:
    return f"{sys.implementation.cache_tag} {importlib.machinery.EXTENSION_SUFFIXES[0]}"


class _CompiledFinder:
    """A `sys.meta_path` finder: the compiled modules and mypyc's shared library, from the build."""

    def __init__(self, extensions: dict[str, Path]) -> None:
        self._extensions = extensions

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        where = self._extensions.get(fullname)
        if where is None:
            return None
        return importlib.util.spec_from_file_location(fullname, where)


def _check(where: Path) -> tuple[dict[str, Path], str]:
    """The extension of each module in the build at `where`, or why it cannot be used."""
    try:
        manifest = json.loads((where / MANIFEST).read_text())
    except FileNotFoundError:
        return {}, f"no compiled build in {where}: `make` builds it"
    except (OSError, ValueError) as exc:
        return {}, f"unreadable manifest in {where}: {exc}"
    if manifest.get("python") != python_tag():
        return {}, f"built for {manifest.get('python')}, this is {python_tag()}"
    if tuple(manifest.get("modules", ())) != COMPILED_MODULES:
        return {}, "stale build: the list of compiled modules changed; `make` rebuilds it"
    changed = stale_file(manifest.get("files", {}))
    if changed is not None:
        return {}, f"stale build: {changed} changed since; `make` rebuilds it"
    extensions = {name: where / rel for name, rel in manifest.get("extensions", {}).items()}
    needed = (*COMPILED_MODULES, RUNTIME)
    missing = [m for m in needed if m not in extensions or not extensions[m].is_file()]
    if missing:
        return {}, f"incomplete build in {where}: no {missing[0]}"
    return extensions, ""


@functools.cache
def install() -> CoreStatus:
    """Load the compiled core from now on if it is usable; once per process."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return CoreStatus(compiled=False, reason=f"{PURE_ENV}=1")
    where = build_dir()
    extensions, reason = _check(where)
    finder = _CompiledFinder(extensions)
    if not reason:
        try:  # the shared library: proves the build links against this interpreter
            spec = finder.find_spec(RUNTIME, None)
            assert spec is not None and spec.loader is not None
            library = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(library)
            sys.modules[RUNTIME] = library
        except (ImportError, OSError, AssertionError) as exc:
            reason = f"the compiled build in {where} does not load: {exc}"
    if reason:
        import logging  # here: a process that loads the build need not import logging

        logging.getLogger(__name__).warning(
            "compiled_core_fallback: %s; running pure Python", reason
        )
        return CoreStatus(compiled=False, reason=reason)
    sys.meta_path.insert(0, finder)
    return CoreStatus(compiled=True, where=str(where))


def status() -> CoreStatus:
    """The core this process loaded (`install()` ran when `services` was imported)."""
    return install()
