"""A local notification sink for the embedded stack (`sickbay demo` / `sickbay up`).

Escalations have to land somewhere visible without a PagerDuty account or a Slack workspace.
The sink answers the three channel types the worker speaks, the way the real services do:

    POST /v2/enqueue   PagerDuty Events API v2  -> 202 {"status": "success", "dedup_key": ...}
    POST /slack        Slack incoming webhook   -> 200 "ok"
    POST /webhook      generic JSON webhook     -> 200 {"received": true}
    GET  /events       everything received, oldest first (JSON list)
    GET  /healthz      200 once listening

Each notification is also appended as one JSON line to `--out`, so the demo can show it and
a person can `tail -f` it. Bodies are kept as received; a routing key in a PagerDuty event is
replaced by "<redacted>" before it is stored (the demo's key is a throwaway, but a sink that
stores credentials is a bad pattern to copy).

    python -m worker.sink --port 0 --out /tmp/notifications.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024  # bytes; notifications are a few KiB, refuse anything absurd
KINDS = {"/v2/enqueue": "pagerduty", "/slack": "slack", "/webhook": "webhook"}


class Sink:
    """Received notifications, in memory and (optionally) as JSON lines in a file."""

    def __init__(self, out: Path | None = None) -> None:
        self.out = out
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def record(self, kind: str, body: Any) -> dict[str, Any]:
        if kind == "pagerduty" and isinstance(body, dict) and "routing_key" in body:
            body = {**body, "routing_key": "<redacted>"}
        entry = {"received_at": datetime.now(UTC).isoformat(), "kind": kind, "body": body}
        with self._lock:
            self.events.append(entry)
            if self.out is not None:
                with self.out.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps(entry) + "\n")
        return entry


def make_handler(sink: Sink) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "sickbay-sink/1"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("sink: " + format, *args)

        def _reply(self, status: int, body: Any) -> None:
            raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            ctype = "text/plain" if isinstance(body, str) else "application/json"
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._reply(200, {"ok": True})
            elif self.path == "/events":
                with sink._lock:
                    events = list(sink.events)
                self._reply(200, events)
            else:
                self._reply(404, {"error": f"no such path {self.path}"})

        def do_POST(self) -> None:
            kind = KINDS.get(self.path)
            if kind is None:
                self._reply(404, {"error": f"no such path {self.path}"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._reply(413, {"error": "body too large"})
                return
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw or b"null")
            except ValueError:
                # PagerDuty answers 400 {"status": "invalid event"} to a body it cannot parse.
                self._reply(400, {"status": "invalid event", "message": "body is not JSON"})
                return
            sink.record(kind, body)
            if kind == "pagerduty":
                dedup = body.get("dedup_key", "") if isinstance(body, dict) else ""
                self._reply(
                    202,
                    {"status": "success", "message": "Event processed", "dedup_key": dedup},
                )
            elif kind == "slack":
                self._reply(200, "ok")
            else:
                self._reply(200, {"received": True})

    return Handler


def serve(host: str, port: int, sink: Sink) -> ThreadingHTTPServer:
    """Start serving on a background thread; returns the server (`.server_address`)."""
    server = ThreadingHTTPServer((host, port), make_handler(sink))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="notification-sink", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.sink", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sink = Sink(args.out)
    server = serve(args.host, args.port, sink)
    port = server.server_address[1]
    print(f"notification sink listening on http://{args.host}:{port}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
