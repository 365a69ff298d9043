"""Gauges of what is open, for dashboards and alerts: `sickbay_remediations_open{phase}`, and
`sickbay_cluster_paused{cluster}` (1 while `sickbay pause` holds the cluster), whose changes
are also posted as Kubernetes Events (`report_pause`).

Counters and histograms come from the workflows as things happen; how many remediations are
open in each phase now is a question for Temporal's visibility store, asked every
`OPEN_EVERY` seconds by each worker for its own cluster (replicas report the same numbers:
aggregate with `max by (phase)`, not `sum`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime

from temporalio.client import Client
from temporalio.common import MetricMeter
from temporalio.runtime import Runtime

from contract.budget import BudgetState, PauseRecord
from contract.names import QRY_BUDGET_STATE, SA_CLUSTER, SA_PHASE, WF_REMEDIATE
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


async def paused_state(client: Client, budget_id: str) -> BudgetState | None:
    """The budget's state; None when it does not run yet (nothing paused)."""
    from temporalio.service import RPCError, RPCStatusCode

    try:
        return await client.get_workflow_handle(budget_id).query(
            QRY_BUDGET_STATE, result_type=BudgetState
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def report_pause(
    client: Client,
    budget_id: str,
    cluster: str,
    stop: asyncio.Event,
    on_record: Callable[[PauseRecord], None] | None = None,
    meter: MetricMeter | None = None,
    every: float = OPEN_EVERY,
) -> None:
    """Set `sickbay_cluster_paused{cluster}` (1 paused, 0 not) from the budget workflow's
    state until `stop`, and hand every pause/resume recorded since this process started (the
    latest one at start) to `on_record` (the Kubernetes Event; Events are named from the
    record, so replicas and restarts post each one once). A failed read keeps the last value."""
    meter = meter or Runtime.default().metric_meter
    gauge = meter.create_gauge(
        "sickbay_cluster_paused", "1 while `sickbay pause` holds the cluster, else 0"
    ).with_additional_attributes({"cluster": cluster})
    seen: datetime | None = None
    started = False
    failing = False
    while not stop.is_set():
        try:
            state = await paused_state(client, budget_id)
            gauge.set(1 if state is not None and state.pause is not None else 0)
            log_ = state.pause_log if state is not None else []
            new = [r for r in log_ if seen is None or r.at > seen] if started else log_[-1:]
            for record in new:
                if on_record is not None:
                    await asyncio.to_thread(on_record, record)
                seen = record.at
            started = True
            failing = False
        except Exception as exc:  # Temporal or the API server away: the next round tries again
            if not failing:
                log.warning("cannot report the pause state of %s: %s", budget_id, exc)
            failing = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every)
