"""Structured JSON logging: one line per event, stable snake_case event names, trace ids.

Call `log.info("client_connected", extra={"client_id": ...})`; every extra field becomes a JSON
key, and the current OpenTelemetry span adds `trace_id` and `span_id`. Every finished line is
scrubbed of secrets (services/common/redact.py) whatever path brought them in.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from opentelemetry import trace

from services.common.redact import scrub

_STD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str, node_id: str) -> None:
        super().__init__()
        self._service = service
        self._node = node_id

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": record.getMessage(),
            "logger": record.name,
            "service": self._service,
            "node": self._node,
        }
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            out["trace_id"] = f"{ctx.trace_id:032x}"
            out["span_id"] = f"{ctx.span_id:016x}"
        for key, value in vars(record).items():
            if key not in _STD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return scrub(json.dumps(out, default=str))


def setup_logging(service: str, node_id: str, level: str, log_file: Path | None) -> None:
    root = logging.getLogger()
    root.handlers.clear()
    fmt = JsonFormatter(service, node_id)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)
    root.setLevel(level)
    for noisy in ("asyncio", "grpc", "cassandra", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
