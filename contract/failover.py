"""How fast work moves off a worker that died (SIGKILL, node lost) to a live one.

Temporal hands a workflow's next task to the worker that ran its last one (its sticky queue),
and a task a worker took is its own until the workflow task timeout. Both default to 10 s, so a
killed worker held every remediation it was running, and the budget's lease updates when it
held the budget workflow, for 10 s or more: in the fleet benchmark (bench/fleet.py) three of
four clusters quarantined nothing for 10 s after the kill.

- `WORKFLOW_TASK_TIMEOUT` is set when Sickbay starts a remediation, the budget or the GPU
  ledger (and kept by their continue-as-new). A task's own work takes milliseconds; local
  activities longer than it are covered by the SDK's task heartbeat, so it bounds only a
  worker that died or hangs. 5 s leaves a loaded worker room (a task that overruns it is
  retried elsewhere, it is never lost).
- `STICKY_SCHEDULE_TO_START` is each Worker's sticky queue wait: a task not picked up from a
  (dead) worker's sticky queue within it goes to the shared queue, where any worker takes it.
"""

from __future__ import annotations

from datetime import timedelta

WORKFLOW_TASK_TIMEOUT = timedelta(seconds=5)
STICKY_SCHEDULE_TO_START = timedelta(seconds=3)
