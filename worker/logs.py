"""How Sickbay's processes log: plain text (the default) or `--log-format json`, one JSON
object a line for log pipelines (Loki, Elasticsearch, Cloud Logging).

A JSON line carries `time` (UTC, ISO 8601), `level`, `logger` and `message`, and, where the
line is about one: `workflow_id`, `run_id`, `workflow_type`, `activity_type` (from the Temporal
SDK's workflow and activity loggers), `device`, `node` and `phase` (from the remediation's own
lines), and `exception` (the formatted traceback of an unexpected error).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring for the fields)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for source, keys in (
            ("temporal_workflow", ("workflow_id", "run_id", "workflow_type")),
            ("temporal_activity", ("workflow_id", "workflow_run_id", "activity_type")),
            ("sickbay", ("device", "node", "phase")),
        ):
            info = getattr(record, source, None)
            if isinstance(info, dict):
                for key in keys:
                    if info.get(key) not in (None, ""):
                        out["run_id" if key == "workflow_run_id" else key] = info[key]
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure(log_format: str, level: int = logging.INFO) -> None:
    """Set up the root logger for this process. Text keeps the commands' own `basicConfig`
    (a no-op once a handler exists); JSON installs its handler first, so theirs do nothing, and
    drops the Temporal loggers' info appended to each message (it is in the fields instead)."""
    if log_format != "json":
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    from temporalio import activity, workflow

    workflow.logger.workflow_info_on_message = False
    activity.logger.activity_info_on_message = False


def is_json() -> bool:
    """Whether this process logs JSON (`configure("json")` ran)."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)
