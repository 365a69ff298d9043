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

Bounded on disk: the journal never grows past `max_bytes` (SICKBAY_WEBHOOK_SPOOL_MAX_BYTES).
An add that would take it past is first helped by a compaction (when the `done` lines are
what fills it) and otherwise refused whole (`SpoolFull`), before anything is acknowledged; the
webhook then waits for Temporal as without a spool (503 past its deadline). A compaction
writes the pending records to a new file before the old one goes, so the directory needs
`spool_disk_bytes(max_bytes)`: the size a Kubernetes emptyDir's `sizeLimit` must have
(deploy/webhook.yaml; a test keeps the two in step), or the kubelet evicts the pod and the
acknowledged alerts with it.

No torn lines: records are written with unbuffered writes; when a write fails part-way (a full
disk writes what fits, then fails) the file is cut back to its last whole record, so the add
is reported failed and nothing half-written is left behind. A `done` record that cannot be
written is kept and written before the next record that can be (until then, a restart would
only deliver that alert again, which the workflow ignores by fingerprint).
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
DEFAULT_MAX_BYTES = 100 * 1024 * 1024
# Beside the journal and a compaction's copy of the pending records: the lock file and the
# directory's own blocks.
DISK_SLACK_BYTES = 1024 * 1024


def spool_disk_bytes(max_bytes: int) -> int:
    """Disk a spool capped at `max_bytes` may use at most: the journal, plus the new file a
    compaction writes (at most as large) before the old one is removed, plus slack."""
    return 2 * max_bytes + DISK_SLACK_BYTES


class SpoolError(RuntimeError):
    """The spool cannot be used (directory not writable, locked by another process)."""


class SpoolFull(Exception):
    """The spool takes no more now: `reason` is "count" (max_pending) or "bytes" (max_bytes)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


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

    def __init__(
        self, directory: Path, max_pending: int = 100_000, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.directory = directory
        self.max_pending = max_pending
        self.max_bytes = max_bytes
        self.pending: dict[DeliveryKey, MappedAlert] = {}
        self._lock = threading.Lock()
        self._file: BinaryIO | None = None
        self._lock_file: BinaryIO | None = None
        self._done_since_compact = 0
        self.size = 0  # bytes in the journal file now
        self._record_bytes: dict[DeliveryKey, int] = {}  # each pending add record's size
        self._unwritten_done: list[bytes] = []  # done records a failed write left out

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
        records = {
            k: _line({"op": "add", "alert": alert_to_json(m)}) for k, m in self.pending.items()
        }
        try:
            with tmp.open("wb") as f:
                for data in records.values():
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            tmp.unlink(missing_ok=True)  # the old journal is untouched and still valid
            raise
        os.replace(tmp, path)
        _fsync_dir(self.directory)
        if self._file is not None:
            self._file.close()
        self._file = path.open("ab", buffering=0)
        self._done_since_compact = 0
        self._record_bytes = {k: len(v) for k, v in records.items()}
        self.size = sum(self._record_bytes.values())
        self._unwritten_done = []  # the rewritten journal has no record of what is done

    # -------------------------------------------------------------------- journal ---------

    def room(self, n: int, nbytes: int = 0) -> bool:
        """Whether `n` more alerts of `nbytes` journal bytes would fit now (a cheap check;
        `add` decides, compacting first when that makes the room)."""
        pending_bytes = sum(self._record_bytes.values())
        return (
            len(self.pending) + n <= self.max_pending and pending_bytes + nbytes <= self.max_bytes
        )

    def add(self, alerts: list[MappedAlert]) -> int:
        """Journal `alerts` and flush to disk; returns how many were not pending already.
        Raises SpoolFull (over max_pending or max_bytes) or OSError (the write failed) with
        nothing spooled and no partial record left in the journal."""
        with self._lock:
            if self._file is None:
                raise OSError("the webhook spool is closed")
            new = [m for m in alerts if m.delivery_key() not in self.pending]
            if not new:
                return 0
            if len(self.pending) + len(new) > self.max_pending:
                raise SpoolFull(
                    "count",
                    f"{len(self.pending)} alerts pending; {len(new)} more would pass "
                    f"SICKBAY_WEBHOOK_SPOOL_MAX ({self.max_pending})",
                )
            records = [(m, _line({"op": "add", "alert": alert_to_json(m)})) for m in new]
            data = b"".join(self._unwritten_done) + b"".join(r for _m, r in records)
            if self.size + len(data) > self.max_bytes:
                pending_bytes = sum(self._record_bytes.values())
                need = sum(len(r) for _m, r in records)
                if pending_bytes + need > self.max_bytes:
                    raise SpoolFull(
                        "bytes",
                        f"{pending_bytes} bytes of alerts pending; {need} more would pass "
                        f"SICKBAY_WEBHOOK_SPOOL_MAX_BYTES ({self.max_bytes})",
                    )
                self._compact()  # the done records are what fills it: drop them
                data = b"".join(r for _m, r in records)
            self._append(data)
            os.fsync(self._file.fileno())
            self._unwritten_done = []
            for m, record in records:
                self.pending[m.delivery_key()] = m
                self._record_bytes[m.delivery_key()] = len(record)
            return len(new)

    def _append(self, data: bytes) -> None:
        """Write `data` at the end of the journal, whole or not at all: after a failure part-way
        (disk full) the file is cut back to where it was and the error raised."""
        assert self._file is not None
        start = self.size
        view = memoryview(data)
        try:
            while view:
                written = self._file.write(view)
                if not written:
                    raise OSError("the journal write made no progress")
                view = view[written:]
        except OSError:
            try:
                os.ftruncate(self._file.fileno(), start)
            except OSError as cut:  # nothing more to do here; a reopen skips a torn line
                log.error("webhook spool: cannot cut a partial record off the journal: %s", cut)
            raise
        self.size = start + len(data)

    def done(self, key: DeliveryKey) -> None:
        """Temporal accepted `key`: forget it (compacting once the journal is mostly done)."""
        with self._lock:
            if self.pending.pop(key, None) is None or self._file is None:
                return
            self._record_bytes.pop(key, None)
            record = _line({"op": "done", "key": list(key)})
            try:
                if not self.pending:
                    # Nothing pending: the journal can simply be emptied (a crash before or
                    # after this leaves a consistent file either way).
                    os.ftruncate(self._file.fileno(), 0)
                    self.size = 0
                    self._unwritten_done = []
                    self._done_since_compact = 0
                    return
                data = b"".join(self._unwritten_done) + record
                if self.size + len(data) > self.max_bytes or self._done_since_compact >= 10_000:
                    self._compact()  # rewrites the pending ones only: this one is dropped
                    return
                self._append(data)
                self._unwritten_done = []
                self._done_since_compact += 1
            except OSError as exc:
                # Kept, and written before the next record that can be; until then a restart
                # only costs a repeated delivery (the workflow ignores it by fingerprint).
                self._unwritten_done.append(record)
                log.warning("webhook spool: could not record a delivery as done: %s", exc)


def _line(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
