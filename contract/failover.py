"""How fast work moves off a worker that died (SIGKILL, node lost) to a live one.

Temporal hands a workflow's next task to the worker that ran its last one (its sticky queue),
and a task a worker took is its own until the workflow task timeout; both default to 10 s. In
the fleet benchmark (bench/fleet.py: 4 clusters, one worker of each SIGKILLed 1.5 s into a
200-GPU burst) three of four clusters quarantined nothing for 10 s after the kill: the killed
worker held its cluster's budget workflow, and every lease request waited for it.

- `SHARED_TASK_TIMEOUT` (5 s) is the workflow task timeout of the two workflows every
  remediation waits on, the budget and the GPU ledger: set when they start (update-with-start)
  and at each continue-as-new. Their tasks decide a batch of requests in milliseconds. With
  it, the clusters' idle spell after the kill fell from 10-12 s to 4-6 s and the median rule
  from 14 s to 9 s after the burst began (2026-12-06).
- Remediations keep the server's 10 s. Their first task runs the confirm step's local
  activities, seconds long on an overloaded worker: with 5 s the surviving worker's own tasks
  timed out in the same benchmark and waited again in the queue (the last rule came later:
  30-34 s, against 17-29 s with 10 s).
- `STICKY_SCHEDULE_TO_START` (3 s) is every Worker's sticky queue wait: a task a (dead)
  worker's sticky queue has not handed out within it goes to the shared queue, where any
  worker takes it.
- `PROVIDER_BEAT` (10 s) and `PROVIDER_HEARTBEAT` (30 s, three beats): an activity waiting on
  one provider call (a pool resize or its description, a node reboot or replace) heartbeats
  every beat, and the workflows schedule it with that heartbeat timeout, so a worker killed
  mid-call is retried elsewhere within 30 s, not after the call's start-to-close (minutes);
  the retry asks nothing twice (it adopts what it finds at the provider, docs/cloud.md).
- `WORKFLOW_TASK_POLLS` (8) and `NONSTICKY_TO_STICKY_POLLS` (1.0): the remediation Worker's
  workflow-task pollers, half of them on the shared queue. The SDK's 5 pollers with a ratio
  of 0.2 keep one on the shared queue, where every new remediation's first task waits, and
  where a task the killed worker held comes back after its timeout. In the fleet benchmark
  (2026-12-07, same code otherwise) such a task then waited 9 s more for that one poller
  (20 s in a trial with a 5 s task timeout), while the survivor's sticky queue kept the
  others busy; the slowest GPU took 20.5-27.6 s in 5 of 6 runs. With these, such tasks
  started again after p50 0.1-1.8 s per cluster, and the slowest GPU took 11.6-19.6 s in 8
  runs (median 15.9 s), 3 of them within the 15 s goal.
"""

from __future__ import annotations

from datetime import timedelta

SHARED_TASK_TIMEOUT = timedelta(seconds=5)
STICKY_SCHEDULE_TO_START = timedelta(seconds=3)
PROVIDER_BEAT = timedelta(seconds=10)
PROVIDER_HEARTBEAT = 3 * PROVIDER_BEAT
WORKFLOW_TASK_POLLS = 8
NONSTICKY_TO_STICKY_POLLS = 1.0
