"""Activity options the remediation and the node incident share (each module's `calls` keeps
the ones only it uses): the long waits, the eviction's heartbeat and the capacity request.
Both procedures wait for the same things the same way, so a change to one wait changes it for
both. The provider calls' heartbeat is `contract.failover.PROVIDER_HEARTBEAT`."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

# Long waits (watch-based activities: a GPU's pods leaving, the replacements scheduled): they
# heartbeat, so a dead worker is noticed within a minute and another worker resumes from the
# heartbeat details; 3 attempts, then the step escalates. A wait has no deadline of its own
# past the workflow's timer, so its timeout is the deadline plus WAIT_MARGIN (the activity's
# own deadline fires first and reports).
WAIT_HEARTBEAT = timedelta(seconds=60)
WAIT_MARGIN = timedelta(minutes=2)
WAIT_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=5),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
)
# One look at the replacements (a list, a few claim reads) when the deadline timer fires.
LOOK_TIMEOUT = timedelta(minutes=1)

# evict-pods heartbeats every 10 s; a killed worker is noticed after 30 s, not its
# start-to-close (evicting again is harmless: pods already gone are reported gone).
EVICT_HEARTBEAT = timedelta(seconds=30)

# Capacity requests go to the pool scaler workflow, which may hold the call while it batches
# concurrent needs and follows the provider's operation (up to 15 min). request-capacity
# heartbeats every 10 s while the scaler holds it; a worker killed mid-call is noticed after
# 45 s, and the retry re-attaches to the same request (its key), so nothing is asked twice.
# Four attempts, then the step escalates (the remediation) or its page says the scale-up
# failed (the node incident).
CAPACITY_TIMEOUT = timedelta(minutes=15)
CAPACITY_HEARTBEAT = timedelta(seconds=45)
CAPACITY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=10),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=1),
    maximum_attempts=4,
)
