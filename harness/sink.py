"""A local notification sink for the embedded stack (`sickbay-dev demo` / `sickbay-dev up`).

Escalations have to land somewhere visible without a PagerDuty account or a Slack workspace.
The sink answers the three channel types the worker speaks, the way the real services do:

    POST /v2/enqueue   PagerDuty Events API v2  -> 202 {"status": "success", "dedup_key": ...}
    POST /slack        Slack incoming webhook   -> 200 "ok"
    POST /webhook      generic JSON webhook     -> 200 {"received": true}
    GET  /events       everything received, oldest first (JSON list)
    GET  /healthz      200 once listening

For fault drills the sink can play a service that hangs: a fault rule holds the next `count`
POSTs to one path for `holdSeconds`, then answers `status` (default 503) and records nothing,
as PagerDuty does not process an event it answered 5xx (the sender must retry).

    POST   /faults     {"path": "/v2/enqueue", "count": 1, "holdSeconds": 8, "status": 503}
                       -> 201 {"id": 1, ...}
    GET    /faults     {"items": [rules with "held" (so far) and "holding" (right now)]}
    DELETE /faults     remove every rule

Each notification is also appended as one JSON line to `--out`, so the demo can show it and
a person can `tail -f` it. Bodies are kept as received; a routing key in a PagerDuty event is
replaced by "<redacted>" before it is stored (the demo's key is a throwaway, but a sink that
stores credentials is a bad pattern to copy).

    python -m harness.sink --port 0 --out /tmp/notifications.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024  # bytes; notifications are a few KiB, refuse anything absurd
KINDS = {"/v2/enqueue": "pagerduty", "/slack": "slack", "/webhook": "webhook"}
MAX_HOLD_SECONDS = 300.0  # a drill holds a request for seconds; longer is a mistake


@dataclass
class FaultRule:
    """Hold the next `count` POSTs to `path` for `hold_seconds`, then answer `status`."""

    path: str
    count: int = 1
    hold_seconds: float = 0.0
    status: int = 503
    id: int = 0
    held: int = 0  # requests this rule took (held, then failed)
    holding: int = 0  # of those, still being held now

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["holdSeconds"] = d.pop("hold_seconds")
        return d


class Sink:
    """Received notifications, in memory and (optionally) as JSON lines in a file."""

    def __init__(self, out: Path | None = None) -> None:
        self.out = out
        self.events: list[dict[str, Any]] = []
        self.faults: list[FaultRule] = []
        self._lock = threading.Lock()
        self._next_fault = 1

    def add_fault(
        self, path: str, count: int = 1, hold_seconds: float = 0.0, status: int = 503
    ) -> FaultRule:
        """A fault rule for one of KINDS' paths; ValueError naming the bad field."""
        if path not in KINDS:
            raise ValueError(f"path must be one of {', '.join(sorted(KINDS))}, not {path!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be an integer >= 1, not {count!r}")
        if (
            isinstance(hold_seconds, bool)
            or not isinstance(hold_seconds, int | float)
            or not 0 <= hold_seconds <= MAX_HOLD_SECONDS
        ):
            raise ValueError(
                f"holdSeconds must be a number from 0 to {MAX_HOLD_SECONDS:g}, not {hold_seconds!r}"
            )
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            raise ValueError(f"status must be an HTTP error status (400-599), not {status!r}")
        with self._lock:
            rule = FaultRule(path, count, float(hold_seconds), status, id=self._next_fault)
            self._next_fault += 1
            self.faults.append(rule)
            return rule

    def take_fault(self, path: str) -> FaultRule | None:
        """The rule that takes this request, if any (counted as held)."""
        with self._lock:
            for rule in self.faults:
                if rule.path == path and rule.held < rule.count:
                    rule.held += 1
                    rule.holding += 1
                    return rule
        return None

    def release(self, rule: FaultRule) -> None:
        with self._lock:
            rule.holding -= 1

    def fault_rules(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.to_json() for r in self.faults]

    def clear_faults(self) -> int:
        with self._lock:
            removed = len(self.faults)
            self.faults = []
            return removed

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
            elif self.path == "/faults":
                self._reply(200, {"items": sink.fault_rules()})
            else:
                self._reply(404, {"error": f"no such path {self.path}"})

        def do_DELETE(self) -> None:
            if self.path == "/faults":
                self._reply(200, {"removed": sink.clear_faults()})
            else:
                self._reply(404, {"error": f"no such path {self.path}"})

        def _add_fault(self, raw: bytes) -> None:
            try:
                data = json.loads(raw or b"null")
            except ValueError:
                self._reply(400, {"error": "body is not JSON"})
                return
            if not isinstance(data, dict):
                self._reply(400, {"error": "body must be a JSON object"})
                return
            unknown = set(data) - {"path", "count", "holdSeconds", "status"}
            if unknown:
                self._reply(400, {"error": f"unknown field(s): {', '.join(sorted(unknown))}"})
                return
            try:
                rule = sink.add_fault(
                    data.get("path", ""),
                    data.get("count", 1),
                    data.get("holdSeconds", 0.0),
                    data.get("status", 503),
                )
            except ValueError as err:
                self._reply(400, {"error": str(err)})
                return
            self._reply(201, rule.to_json())

        def _fail_held(self, rule: FaultRule) -> None:
            try:
                time.sleep(rule.hold_seconds)
            finally:
                # No longer held once the answer goes out: a sender that has it and asks
                # /faults next sees holding 0.
                sink.release(rule)
            try:
                self._reply(
                    rule.status,
                    {
                        "status": "unavailable",
                        "message": f"held and failed by sink fault {rule.id}",
                    },
                )
            except OSError:  # the sender may be gone (a killed worker): nothing to answer
                self.close_connection = True

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._reply(413, {"error": "body too large"})
                return
            if self.path == "/faults":
                self._add_fault(self.rfile.read(length))
                return
            kind = KINDS.get(self.path)
            if kind is None:
                self._reply(404, {"error": f"no such path {self.path}"})
                return
            raw = self.rfile.read(length)
            rule = sink.take_fault(self.path)
            if rule is not None:
                self._fail_held(rule)
                return
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
    parser = argparse.ArgumentParser(prog="python -m harness.sink", description=__doc__)
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
