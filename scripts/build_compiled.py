"""Compile the sans-I/O core with mypyc (`python -m scripts.build_compiled`; `make` runs it).

The modules are `services.compiled.COMPILED_MODULES`; the build goes to
`<sys.prefix>/compiled/` (services/compiled.py loads it from there), so the .py files stay
where they are and still run when `STARLING_PURE=1`. Incremental: nothing is done when the
manifest's key (a hash over the sources mypy reads, the Python, mypy and this script) matches.
Never fails its caller: a failed build logs a warning (the compiler's output is in
`<sys.prefix>/compiled.log`), is not tried again for the same sources unless `--force`, and
everything runs as Python.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ["STARLING_PURE"] = "1"  # this process only reads the sources, never loads a build

from services import compiled

ROOT = compiled.ROOT
SCRIPT = Path(__file__).resolve()
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _imported_files(module: str) -> set[Path]:
    """The services.* modules `module` imports: mypyc compiles against their types too."""
    tree = ast.parse(compiled.module_file(module).read_text())
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    found = set()
    for name in names:
        if not name.startswith("services."):
            continue
        path = compiled.module_file(name)
        package = ROOT / name.replace(".", "/") / "__init__.py"
        found |= {p for p in (path, package) if p.is_file()}
    return found


def source_files() -> dict[str, str]:
    """Every source the build reads (relative to ROOT) and its SHA-256."""
    paths: set[Path] = set()
    for module in compiled.COMPILED_MODULES:
        paths.add(compiled.module_file(module))
        paths |= _imported_files(module)
    return {str(p.relative_to(ROOT)): compiled.file_digest(p) for p in sorted(paths)}


def build_key(files: dict[str, str]) -> str:
    from mypy.version import __version__ as mypy_version

    parts = [
        compiled.python_tag(),
        mypy_version,
        compiled.file_digest(SCRIPT),
        *compiled.COMPILED_MODULES,
    ]
    parts += [f"{rel}={digest}" for rel, digest in sorted(files.items())]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def compile_into(out: Path) -> None:
    """mypyc and the C compiler, in this process (run as a child by `build`)."""
    from mypyc.build import mypycify
    from setuptools import setup  # type: ignore[import-untyped]

    paths = [str(compiled.module_file(m).relative_to(ROOT)) for m in compiled.COMPILED_MODULES]
    # Strict typing (pyproject.toml) for the compiled modules; a type error in a module they
    # only import (make types reports it) does not stop the build.
    options = ["--follow-imports=silent"]
    extensions = mypycify(
        [*options, *paths], opt_level="3", group_name=compiled.GROUP, target_dir=str(out / "c")
    )
    temp = str(out / "obj")
    lib = str(out / "lib")
    setup(
        name=compiled.GROUP,
        ext_modules=extensions,
        script_args=["build_ext", "--build-lib", lib, "--build-temp", temp],
    )


def _extensions(lib: Path) -> dict[str, str]:
    """Each built module's name and its extension file (relative to the build folder)."""
    found = {}
    for path in lib.rglob("*" + SUFFIX):
        rel = path.relative_to(lib)
        name = str(rel)[: -len(SUFFIX)]
        found[name.replace("/", ".")] = str(Path("lib") / rel)
    return found


def build(target: Path, key: str, files: dict[str, str], log_path: Path) -> None:
    """Build into a fresh folder beside `target`, then put it in place of the old build."""
    work = target.with_name(target.name + ".new")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.monotonic()
    try:
        with log_path.open("w") as log:
            subprocess.run(
                [sys.executable, "-m", "scripts.build_compiled", "--compile-into", str(work)],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
            )
    except subprocess.CalledProcessError:
        shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(work / "c")
    shutil.rmtree(work / "obj")
    manifest = {
        "key": key,
        "python": compiled.python_tag(),
        "modules": list(compiled.COMPILED_MODULES),
        "files": files,
        "extensions": _extensions(work / "lib"),
        "build_seconds": round(time.monotonic() - started, 1),
    }
    (work / compiled.MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    shutil.rmtree(target, ignore_errors=True)
    work.rename(target)


def _current_key(target: Path) -> str | None:
    try:
        return str(json.loads((target / compiled.MANIFEST).read_text())["key"])
    except (OSError, ValueError, KeyError):
        return None


def _warn(what: str) -> None:
    print(f"build_compiled: warning: {what}; running pure Python", file=sys.stderr)


def update(force: bool) -> None:
    """Build unless the build is current (or failed before for the same sources)."""
    target = compiled.build_dir()
    failed = target.with_name(target.name + ".failed")
    log_path = target.with_name(target.name + ".log")
    files = source_files()
    key = build_key(files)
    if not force and _current_key(target) == key:
        return
    if not force and failed.is_file() and failed.read_text() == key:
        _warn(f"the last build of these sources failed ({log_path}; --force tries again)")
        return
    print(f"build_compiled: compiling the core with mypyc into {target} (about a minute)")
    started = time.monotonic()
    try:
        build(target, key, files, log_path)
    except (OSError, subprocess.CalledProcessError) as exc:
        failed.parent.mkdir(parents=True, exist_ok=True)
        failed.write_text(key)
        _warn(f"the build failed ({type(exc).__name__}; {log_path} has the output)")
        return
    failed.unlink(missing_ok=True)
    print(f"build_compiled: done in {time.monotonic() - started:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="build even if up to date")
    parser.add_argument("--compile-into", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compile_into is not None:
        compile_into(args.compile_into)
        return 0
    try:
        update(args.force)
    except Exception as exc:  # no mypy, an unreadable source...: never fail `make`
        _warn(f"no build ({type(exc).__name__}: {exc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
