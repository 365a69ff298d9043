"""`--log-format json`: one JSON object a line, with the remediation's fields where known.

Cases:
- `sickbay --log-format json webhook` (the real process; Temporal down) writes only JSON
  objects to stderr, each with time, level, logger and message, uvicorn's own lines included;
- the formatter takes workflow id, run id and workflow type from the Temporal SDK's workflow
  logger, activity type from its activity logger, device, node and phase from the
  remediation's lines, and the traceback of an unexpected error as `exception`;
(A remediation's own phase lines: tests/workflows/test_log_fields.py.)
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx

from harness.stack import free_port
from worker.logs import JsonFormatter

SICKBAY = str(Path(sys.executable).parent / "sickbay")


def test_the_webhook_logs_one_json_object_a_line(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SICKBAY_")}
    env.update(
        SICKBAY_TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}",
        SICKBAY_WEBHOOK_TOKEN=secrets.token_hex(32),
        SICKBAY_CLUSTER="",
    )
    log = tmp_path / "webhook.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                SICKBAY,
                "--log-format",
                "json",
                "webhook",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    assert any(r["logger"].startswith("uvicorn") for r in records), records


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "temporalio.workflow", logging.INFO, __file__, 1, "a %s", ("b",), None
    )
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_the_formatter_carries_the_remediation_fields() -> None:
    fmt = JsonFormatter()
    wf = json.loads(
        fmt.format(
            _record(
                temporal_workflow={
                    "workflow_id": "sickbay-gpu-n1-gpu-1",
                    "run_id": "r1",
                    "workflow_type": "remediate-gpu-device",
                },
                sickbay={"device": "n1/GPU-1", "node": "n1", "phase": "quarantining"},
            )
        )
    )
    assert wf["message"] == "a b"
    assert (wf["workflow_id"], wf["run_id"], wf["device"], wf["node"], wf["phase"]) == (
        "sickbay-gpu-n1-gpu-1",
        "r1",
        "n1/GPU-1",
        "n1",
        "quarantining",
    )
    act = json.loads(
        fmt.format(
            _record(
                temporal_activity={
                    "workflow_id": "w",
                    "workflow_run_id": "r2",
                    "activity_type": "taint-device",
                }
            )
        )
    )
    assert (act["workflow_id"], act["run_id"], act["activity_type"]) == ("w", "r2", "taint-device")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = _record()
        record.exc_info = sys.exc_info()
    assert "RuntimeError: boom" in json.loads(fmt.format(record))["exception"]
