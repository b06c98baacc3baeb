"""Regenerate the Python stubs under starling/ from protos/ (`make protos`).

Writes `*_pb2.py`, `*_pb2_grpc.py` and their `.pyi` (mypy-protobuf) next to one another so that
`import starling.session.v1.session_pb2` works; `generate(out_dir)` is reused by the staleness
test, which generates into a temporary folder and compares.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.rglob("*.proto"))


def generate(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *[str(p.relative_to(PROTO_DIR)) for p in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for d in [out_dir / "starling", *(out_dir / "starling").rglob("*")]:
        if d.is_dir():
            (d / "__init__.py").touch()


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
    print("protos: generated")
