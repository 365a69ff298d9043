"""The webhook's delivery spool: alerts acknowledged to Alertmanager before Temporal took them.

With `SICKBAY_WEBHOOK_SPOOL_DIR` set, a notification waits for Temporal at most
`SICKBAY_WEBHOOK_ACK_SECONDS`; the deliveries Temporal has not accepted by then are appended
to this journal and flushed to disk (fsync) *before* the 200 goes out, and the webhook keeps
delivering them in the background. A delivery leaves the spool only when Temporal accepted it;
a failed call leaves it for the next redelivery round, and a restarted webhook redelivers
what the previous process left. So a slow Temporal (a storm, a failover) costs Alertmanager
no retries and the on-call no lost alerts, as long as the spool directory survives the
process (a volume; an emptyDir survives a container restart but not the pod).

File format: `journal.jsonl`, one JSON object per line, appended only:

    {"op": "add", "alert": {...MappedAlert...}}     spooled (flushed before the ack)
    {"op": "done", "key": [wf, status, fp, start]}  Temporal accepted it (not flushed: a lost
                                                    `done` only costs a repeated delivery,
                                                    which the workflow ignores by fingerprint)

Opening replays the file (a torn last line from a crash is skipped), rewrites it with only the
pending deliveries, and takes an exclusive lock: two webhooks sharing one spool would deliver
each other's alerts twice and compact each other's file, so the second refuses to start.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import TypeAdapter

from worker.alerts import MappedAlert

log = logging.getLogger(__name__)

DeliveryKey = tuple[str, str, str, str]  # MappedAlert.delivery_key()
JOURNAL = "journal.jsonl"
LOCK = "lock"


class SpoolError(RuntimeError):
    """The spool cannot be used (directory not writable, locked by another process)."""


# A journal record's "alert": MappedAlert as JSON (pydantic, via the dataclass's fields).
_ALERT: TypeAdapter[MappedAlert] = TypeAdapter(MappedAlert)


def alert_to_json(m: MappedAlert) -> dict[str, Any]:
    return _ALERT.dump_python(m, mode="json")  # type: ignore[no-any-return]


def alert_from_json(data: dict[str, Any]) -> MappedAlert:
    return _ALERT.validate_python(data)


class Spool:
    """Pending deliveries, on disk. `add` is durable when it returns; `done` is not (above).

    Thread-safe (`add` may run in a worker thread so the fsync does not stall the event loop).
    """

    def __init__(self, directory: Path, max_pending: int = 100_000) -> None:
        self.directory = directory
        self.max_pending = max_pending
        self.pending: dict[DeliveryKey, MappedAlert] = {}
        self._lock = threading.Lock()
        self._file: BinaryIO | None = None
        self._lock_file: BinaryIO | None = None
        self._done_since_compact = 0

    # -------------------------------------------------------------------- open / close ------

    def check(self) -> None:
        """Raise SpoolError unless the directory can be used now (created, writable, not
        locked by another process); changes nothing else."""
        self._take_lock().close()

    def _take_lock(self) -> BinaryIO:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            lock_file = (self.directory / LOCK).open("ab")
        except OSError as exc:
            raise SpoolError(f"cannot use the webhook spool {self.directory}: {exc}") from exc
        try:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            lock_file.close()
            raise SpoolError(
                f"the webhook spool {self.directory} is in use by another process; give each "
                "webhook replica a spool directory of its own"
            ) from exc
        return lock_file

    def open(self) -> list[MappedAlert]:
        """Lock the directory, replay the journal, compact it; returns the pending deliveries
        (what a previous process acknowledged but did not get into Temporal)."""
        self._lock_file = self._take_lock()
        path = self.directory / JOURNAL
        skipped = 0
        if path.exists():
            for record in self._records(path):
                if record is None:
                    skipped += 1
                    continue
                self._apply(record)
        if skipped:
            log.warning("webhook spool: skipped %d unreadable journal line(s) in %s", skipped, path)
        self._compact()
        if self.pending:
            log.warning(
                "webhook spool: %d acknowledged alert(s) not yet in Temporal from a previous "
                "run; delivering them now",
                len(self.pending),
            )
        return list(self.pending.values())

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
            if self._lock_file is not None:
                self._lock_file.close()  # releases the flock
                self._lock_file = None

    @staticmethod
    def _records(path: Path) -> Iterator[dict[str, Any] | None]:
        with path.open("rb") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    yield None  # a torn write (crash mid-line)
                    continue
                yield record if isinstance(record, dict) else None

    def _apply(self, record: dict[str, Any]) -> None:
        try:
            if record.get("op") == "add":
                m = alert_from_json(record["alert"])
                self.pending[m.delivery_key()] = m
            elif record.get("op") == "done":
                self.pending.pop(tuple(record["key"]), None)  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError) as exc:  # ValidationError is a ValueError
            log.warning("webhook spool: ignoring a malformed journal record: %s", exc)

    def _compact(self) -> None:
        """Rewrite the journal with only the pending deliveries (atomic rename, flushed)."""
        path = self.directory / JOURNAL
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            for m in self.pending.values():
                f.write(_line({"op": "add", "alert": alert_to_json(m)}))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.directory)
        if self._file is not None:
            self._file.close()
        self._file = path.open("ab")
        self._done_since_compact = 0

    # -------------------------------------------------------------------- journal ---------

    def room(self, n: int) -> bool:
        return len(self.pending) + n <= self.max_pending

    def add(self, alerts: list[MappedAlert]) -> int:
        """Journal `alerts` and flush to disk; returns how many were not pending already.
        Raises OSError (nothing spooled) on failure."""
        with self._lock:
            if self._file is None:
                raise OSError("the webhook spool is closed")
            new = [m for m in alerts if m.delivery_key() not in self.pending]
            if not new:
                return 0
            data = b"".join(_line({"op": "add", "alert": alert_to_json(m)}) for m in new)
            self._file.write(data)
            self._file.flush()
            os.fsync(self._file.fileno())
            for m in new:
                self.pending[m.delivery_key()] = m
            return len(new)

    def done(self, key: DeliveryKey) -> None:
        """Temporal accepted `key`: forget it (compacting once the journal is mostly done)."""
        with self._lock:
            if self.pending.pop(key, None) is None or self._file is None:
                return
            try:
                self._file.write(_line({"op": "done", "key": list(key)}))
                self._file.flush()
                self._done_since_compact += 1
                if not self.pending:
                    # Nothing pending: the journal can simply be emptied (a crash before or
                    # after this leaves a consistent file either way).
                    os.ftruncate(self._file.fileno(), 0)
                    self._done_since_compact = 0
                elif self._done_since_compact >= 10_000:
                    self._compact()
            except OSError as exc:
                # Only costs a repeated delivery after a restart (the workflow ignores it).
                log.warning("webhook spool: could not record a delivery as done: %s", exc)


def _line(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
