"""The Pending deadline: a durable deadline a person may move while it runs (the shape of an
updatable timer: started, extended, waited on).

The replace step starts it for each replacement wait (`replacement.pendingDeadline`, then the
capacity deadline after a scale-up), `extend-deadline` moves it (never past its limit, fixed
when the wait starts), and the wait (`workflows.replacement.watch_replacements`) re-reads its
end when `moved()` says an extension came in. Lives for one run: a continue-as-new never
happens during a replacement wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contract.base import format_duration
    from contract.remediation import ExtendDeadlineRequest


def _at(t: datetime) -> str:
    return f"{t:%Y-%m-%d %H:%M:%S} UTC"


@dataclass
class PendingDeadline:
    end: datetime | None = None  # when the running wait's timer fires (None: no wait runs)
    limit: datetime | None = None  # the latest `end` may be moved to
    started: datetime | None = None
    stopped: datetime | None = None
    # Extensions accepted that the wait has not told about yet (an Event each).
    extensions: list[ExtendDeadlineRequest] = field(default_factory=list)

    def start(self, now: datetime, length: timedelta, longest: timedelta) -> datetime:
        """A wait of `length` starts now; extensions may move it up to `longest` from now."""
        self.started, self.stopped = now, None
        self.end = now + length
        self.limit = now + max(length, longest)
        return self.end

    def stop(self, now: datetime) -> None:
        self.stopped = now
        self.end = self.limit = None

    @property
    def running(self) -> bool:
        return self.end is not None

    def current(self) -> datetime:
        """The running wait's end (its timer re-reads it after each extension)."""
        assert self.end is not None
        return self.end

    def moved(self) -> bool:
        return bool(self.extensions)

    def check(self, req: ExtendDeadlineRequest) -> datetime:
        """The new end `req` asks for, or ValueError naming why not (the wait runs)."""
        assert self.end is not None and self.limit is not None and self.started is not None
        new = req.until if req.until is not None else self.end + (req.by or timedelta(0))
        if new <= self.end:
            raise ValueError(
                f"the new deadline {_at(new)} is not after the current one ({_at(self.end)})"
            )
        if new > self.limit:
            raise ValueError(
                f"the new deadline {_at(new)} is past the limit {_at(self.limit)}: a "
                "replacement wait lasts at most "
                f"{format_duration(self.limit - self.started)} from its start"
            )
        return new

    def extend(self, req: ExtendDeadlineRequest, new: datetime) -> datetime:
        """Move the end to `new` (checked by `check`); returns the previous end. `req` is kept
        for the wait to tell."""
        previous = self.current()
        self.end = new
        self.extensions.append(req)
        return previous

    def waited(self) -> str:
        """`waited 5m` for the last wait, `?` when none ended."""
        if self.started is None or self.stopped is None:
            return "?"
        took = timedelta(seconds=round((self.stopped - self.started).total_seconds()))
        return "waited " + format_duration(took)
