"""The audit log page: the newest changes made through the console, the tenant's own for a
tenant token, every tenant's (or one chosen) for the operator; also as JSON lines."""

from __future__ import annotations

import json
from dataclasses import asdict

from aiohttp import web

from services.console.web import render, signed_in

SHOWN = 200


async def audit(request: web.Request) -> web.StreamResponse:
    ctx = await signed_in(request)
    records = await ctx.console.auditor.recent(ctx.tenant or None, SHOWN)
    if request.query.get("format") == "jsonl":
        lines = "".join(json.dumps(asdict(r)) + "\n" for r in records)
        return web.Response(text=lines, content_type="application/x-ndjson")
    return render(request, "audit.html", ctx, records=records)
