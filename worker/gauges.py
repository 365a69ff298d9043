"""Gauges of what is open, for dashboards and alerts: `sickbay_remediations_open{phase}`.

Counters and histograms come from the workflows as things happen; how many remediations are
open in each phase now is a question for Temporal's visibility store, asked every
`OPEN_EVERY` seconds by each worker for its own cluster (replicas report the same numbers:
aggregate with `max by (phase)`, not `sum`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from temporalio.client import Client
from temporalio.common import MetricMeter
from temporalio.runtime import Runtime

from contract.names import SA_CLUSTER, SA_PHASE, WF_REMEDIATE
from contract.remediation import Phase

log = logging.getLogger(__name__)

OPEN_EVERY = 30.0  # seconds; a count per phase is cheap, and alerts look at minutes


def open_query(phase: Phase, cluster: str) -> str:
    query = (
        f"WorkflowType = '{WF_REMEDIATE}' AND ExecutionStatus = 'Running' "
        f"AND {SA_PHASE} = '{phase.value}'"
    )
    return query + (f" AND {SA_CLUSTER} = '{cluster}'" if cluster else "")


async def count_open(client: Client, cluster: str) -> dict[str, int]:
    """Open remediations of `cluster` by phase (every phase but closed, zeros included)."""
    counts = {}
    for phase in Phase:
        if phase is not Phase.CLOSED:
            counts[phase.value] = (await client.count_workflows(open_query(phase, cluster))).count
    return counts


async def report_open_remediations(
    client: Client, cluster: str, stop: asyncio.Event, meter: MetricMeter | None = None
) -> None:
    """Set `sickbay_remediations_open{phase}` until `stop` (on `meter`, by default the
    process's runtime: the worker's Prometheus port); a failed count keeps the last values and
    says so (at most once per failure streak)."""
    meter = meter or Runtime.default().metric_meter
    gauge = meter.create_gauge(
        "sickbay_remediations_open", "Remediations open now, by phase (this cluster)"
    )
    failing = False
    while not stop.is_set():
        try:
            for phase, n in (await count_open(client, cluster)).items():
                gauge.with_additional_attributes({"phase": phase}).set(n)
            failing = False
        except Exception as exc:  # Temporal away: the next round tries again
            if not failing:
                log.warning("cannot count the open remediations: %s", exc)
            failing = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=OPEN_EVERY)
