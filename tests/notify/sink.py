"""A loopback HTTP sink that records what notification channels send, and can answer with
scripted failures (e.g. two 503s, then success)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Sink:
    received: list[Received] = field(default_factory=list)
    failures: dict[str, list[int]] = field(default_factory=dict)  # path -> statuses to answer

    def fail(self, path: str, *statuses: int) -> None:
        self.failures.setdefault(path, []).extend(statuses)

    def at(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]

    def app(self) -> FastAPI:
        app = FastAPI(openapi_url=None, docs_url=None)

        @app.post("/{path:path}")
        async def receive(path: str, request: Request) -> Response:
            full = "/" + path
            self.received.append(Received(full, dict(request.headers), await request.body()))
            queued = self.failures.get(full)
            if queued:
                status = queued.pop(0)
                return JSONResponse(
                    {"status": "unavailable", "message": f"sink says {status}"},
                    status_code=status,
                    headers={"Retry-After": "0"},
                )
            if full.startswith("/v2/enqueue"):  # PagerDuty's answer
                body = json.loads(self.received[-1].body)
                return JSONResponse(
                    {
                        "status": "success",
                        "message": "Event processed",
                        "dedup_key": body["dedup_key"],
                    },
                    status_code=202,
                )
            if full.startswith("/slack/"):
                return PlainTextResponse("ok")
            return Response(status_code=204)

        return app


class LoopbackServer:
    """Serve an ASGI app on 127.0.0.1 (free port) inside the running event loop."""

    def __init__(self, app: Any) -> None:
        self._server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        )
        self._task: asyncio.Task[None] | None = None
        self.url = ""

    async def __aenter__(self) -> LoopbackServer:
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)
        host, port = self._server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
