"""What a remediation tells: the timeline, the phase (current details, metrics), the search
attributes, and Kubernetes Events on the objects a person would `kubectl describe`."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributePair
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from contract.errors import ERR_INVALID_INPUT
    from contract.kube import EventTarget, PodRef, RecordEventInput
    from contract.names import (
        SA_CLUSTER,
        SA_DEVICE,
        SA_ESCALATION,
        SA_NODE,
        SA_OUTCOME,
        SA_PAUSED,
        SA_PHASE,
        SA_WORKLOAD_CLASS,
        WF_REMEDIATE,
    )
    from contract.remediation import (
        AlertEvidence,
        Phase,
        RemediationResult,
        TimelineEntry,
        already_handled,
    )
    from workflows.classify import merge_evidence
    from workflows.identity import claimed_by, sender_identity
    from workflows.remediation.calls import ACTIVITY_FAILED, Calls, error_text
    from workflows.remediation.outcome import Closed
    from workflows.remediation.state import RemediationState

if TYPE_CHECKING:
    from workflows.remediation.actors import Sender

SA_DEVICE_KEY = SearchAttributeKey.for_keyword(SA_DEVICE)
SA_NODE_KEY = SearchAttributeKey.for_keyword(SA_NODE)
SA_WORKLOAD_KEY = SearchAttributeKey.for_keyword(SA_WORKLOAD_CLASS)
SA_PHASE_KEY = SearchAttributeKey.for_keyword(SA_PHASE)
SA_OUTCOME_KEY = SearchAttributeKey.for_keyword(SA_OUTCOME)
SA_ESCALATION_KEY = SearchAttributeKey.for_keyword(SA_ESCALATION)
SA_CLUSTER_KEY = SearchAttributeKey.for_keyword(SA_CLUSTER)
SA_PAUSED_KEY = SearchAttributeKey.for_keyword(SA_PAUSED)

# Owner kinds Events are written on, with the API version `kubectl describe` reads them in.
OWNER_API_VERSIONS = {
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "ReplicaSet": "apps/v1",
    "DaemonSet": "apps/v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
    "JobSet": "jobset.x-k8s.io/v1alpha2",
}


class Journal:
    def __init__(self, state: RemediationState, calls: Calls) -> None:
        self._s = state
        self._calls = calls
        self.metrics = workflow.metric_meter()

    # ------------------------------------------------------------ timeline -----------------

    def log(
        self,
        action: str,
        outcome: str = "",
        actor: str = "sickbay",
        reason: str = "",
        replace_same: bool = False,
        client_identity: str | None = None,
        verification: Literal["", "verified", "unverified"] = "",
        groups: list[str] | None = None,
        via: str = "",
    ) -> None:
        """Add a timeline entry; `replace_same`: it replaces the last entry when that one is
        the same action (a run of identical retries stays one entry, the latest)."""
        timeline = self._s.journal.timeline
        if replace_same and timeline and timeline[-1].action == action:
            timeline.pop()
        timeline.append(
            TimelineEntry(
                at=workflow.now(),
                phase=self._s.status.phase,
                action=action,
                outcome=outcome,
                actor=actor,
                reason=reason,
                client_identity=client_identity,
                verification=verification,
                groups=list(groups or []),
                via=via,
            )
        )

    def log_sent(
        self, what: str, action: str, actor: str, reason: str, sender: Sender | None = None
    ) -> None:
        """A timeline entry for a person's signal / update: the verified user (`sender`,
        workflows/remediation/actors.py), or the actor it claims, marked unverified; and the
        Temporal client identity the server recorded with it (`workflows/identity.py`)."""
        identity = sender.identity if sender is not None else sender_identity() or "unknown"
        self._s.journal.sent[what] = (actor, identity)
        verified = sender.verified if sender is not None else None
        if verified is not None:
            self._s.journal.verified_sent[what] = f"{verified.user} (verified via {verified.via})"
        if sender is not None and sender.problem:
            reason = f"{reason} [{sender.problem}]" if reason else f"[{sender.problem}]"
        self.log(
            action,
            actor=actor,
            reason=reason,
            client_identity=identity,
            verification="verified" if verified is not None else "unverified",
            groups=verified.groups if verified is not None else None,
            via=verified.via if verified is not None else "",
        )

    def who(self, what: str) -> str:
        """`<user> (verified via kubernetes)`, or `<actor> (claimed; Temporal client
        <identity>)` of the abort / repaired / decision."""
        verified = self._s.journal.verified_sent.get(what)
        return verified if verified is not None else claimed_by(*self._s.journal.sent[what])

    def add_alerts(self, alerts: list[AlertEvidence], initial: bool = False) -> None:
        st = self._s
        before = st.inp.handled_before
        if before:  # an earlier run handled these (or their evidence): repeats, not evidence
            fresh = [a for a in alerts if not already_handled(a, before)]
            st.status.duplicate_alerts += len(alerts) - len(fresh)
            alerts = fresh
        merged, added = merge_evidence(st.journal.alerts, alerts)
        st.journal.alerts = merged
        st.status.alerts = len(merged)
        st.status.duplicate_alerts += len(alerts) - len(added)
        for alert in added:
            self.log(
                "evidence" if initial else "alert received",
                outcome=f"Xid {alert.xid}" if alert.xid is not None else alert.alertname,
                actor=alert.source,
                reason=alert.summary,
                # The source is the sender's word too: beside it, who sent the signal.
                client_identity=sender_identity(),
            )

    def waits_until(self, until: datetime, moved: bool = False) -> None:
        """The running wait ends at `until` (a deadline started; `moved`: by a person, now)."""
        st = self._s.status
        st.until = until
        if moved:
            st.updated_at = workflow.now()

    # ------------------------------------------------------------ phase --------------------

    def enter(
        self,
        phase: Phase,
        awaiting: str,
        *,
        until: timedelta | None = None,
        next_action: str = "",
    ) -> None:
        """Change phase; `until`: the wait ends by itself that long from now (timeout,
        deadline, retry); `next_action`: what happens then, in words (current details)."""
        st = self._s.status
        if phase is not st.phase:
            workflow.logger.info(
                "remediation %s: %s -> %s",
                st.device,
                st.phase.value,
                phase.value,
                extra={
                    "sickbay": {
                        "device": st.device,
                        "node": st.device.partition("/")[0],
                        "phase": phase.value,
                    }
                },
            )
            self.metrics.create_counter(
                "sickbay_remediation_phase_entered", "Remediations entering each phase"
            ).with_additional_attributes({"phase": phase.value}).add(1)
        st.phase = phase
        st.awaiting = awaiting
        st.updated_at = workflow.now()
        st.until = workflow.now() + until if until is not None else None
        st.next_action = next_action
        workflow.set_current_details(self.details())
        if phase is Phase.CLOSED:
            self.upsert()

    def details(self) -> str:
        """The Web UI's current details: phase, what it waits for and until when, what comes
        next, the escalation (markdown)."""
        st = self._s.status
        dry = " (dry run: nothing is changed)" if self._s.dry else ""
        lines = [f"**{st.phase.value}**{dry}"]
        lines.append(f"device {st.device}" + (f" on node {st.node}" if st.node else ""))
        if st.awaiting:
            until = f" until {st.until:%Y-%m-%d %H:%M:%S} UTC" if st.until else ""
            lines.append(f"waiting for: {st.awaiting}{until}")
        if st.next_action:
            lines.append(f"next: {st.next_action}")
        if st.escalation_reason:
            lines.append(f"escalated: {st.escalation_reason}")
        if st.paused:
            lines.append(f"held: cluster {st.paused}")
        if st.runbook:
            lines.append(f"runbook: {st.runbook}, failure class {st.failure_class or '?'}")
        if st.outcome:
            lines.append(f"outcome: {st.outcome}")
        return "\n\n".join(lines)

    def upsert(self) -> None:
        """Search attributes, only at durable waits and at the end (one event each)."""
        s, st = self._s, self._s.status
        paused = st.paused is not None and st.phase is not Phase.CLOSED
        if s.journal.sa_phase is st.phase and s.journal.sa_paused == paused:
            return
        pairs: list[SearchAttributePair[str]] = [SearchAttributePair(SA_PHASE_KEY, st.phase.value)]
        updates = []
        if paused or s.journal.sa_paused:  # "paused" while held by a pause; unset once it goes on
            updates.append(
                SA_PAUSED_KEY.value_set("paused") if paused else SA_PAUSED_KEY.value_unset()
            )
            s.journal.sa_paused = paused
        if st.escalation_reason:
            pairs.append(SearchAttributePair(SA_ESCALATION_KEY, st.escalation_reason))
        if st.outcome:
            pairs.append(SearchAttributePair(SA_OUTCOME_KEY, st.outcome))
        if s.journal.sa_phase is None:
            pairs.append(SearchAttributePair(SA_DEVICE_KEY, st.device))
            if s.inp.cluster:
                pairs.append(SearchAttributePair(SA_CLUSTER_KEY, s.inp.cluster))
            if st.node:
                pairs.append(SearchAttributePair(SA_NODE_KEY, st.node))
        if st.workload_class:
            pairs.append(SearchAttributePair(SA_WORKLOAD_KEY, st.workload_class))
        workflow.upsert_search_attributes([p.key.value_set(p.value) for p in pairs] + updates)
        s.journal.sa_phase = st.phase

    # ------------------------------------------------------------ begin and end ------------

    def refuse_input(self, problems: str) -> ApplicationError:
        """The run fails at once (raise the result): nothing was done, the Web UI shows why."""
        why = f"invalid input for {WF_REMEDIATE}: {problems}"
        self._s.status.phase, self._s.status.outcome = Phase.CLOSED, None
        self.log("input refused", outcome="failed", reason=why)
        workflow.set_current_details(f"**failed: invalid input**\n\n{problems}")
        workflow.upsert_search_attributes(
            [SA_PHASE_KEY.value_set(Phase.CLOSED.value), SA_OUTCOME_KEY.value_set("invalid-input")]
        )
        return ApplicationError(why, type=ERR_INVALID_INPUT, non_retryable=True)

    async def close(self, ended: Closed) -> RemediationResult:
        s = self._s
        outcome, reason = ended.outcome, ended.reason
        if s.dry and outcome != "dry-run":
            # Whatever a dry run found, it changed nothing: outcome dry-run, and the reason
            # says what a real run would have done.
            would = (
                f" (would escalate: {s.escalation.would_have})" if s.escalation.would_have else ""
            )
            outcome, reason = "dry-run", f"dry run, nothing changed{would}: {reason}"
        s.status.outcome = outcome
        self.enter(Phase.CLOSED, awaiting="")
        self.log("closed", outcome=outcome, reason=reason)
        self.metrics.create_counter(
            "sickbay_remediations_closed", "Remediations closed, by outcome"
        ).with_additional_attributes(
            {"outcome": outcome, "workload_class": s.status.workload_class or ""}
        ).add(1)
        await self.events_written()  # never closed with an Event still on its way
        await workflow.wait_condition(workflow.all_handlers_finished)
        return RemediationResult(
            outcome=outcome,
            reason=reason,
            status=s.status,
            timeline=s.journal.timeline,
            handled_alerts=s.handled_alerts(),
        )

    # ------------------------------------------------------------ Kubernetes Events --------

    def pods_now(self, pods: list[PodRef]) -> None:
        """The pods the next Events go on: the consumers still on the device after the
        eviction, or the replacements last seen Pending / Running."""
        self._s.journal.live_pods = pods

    def event_targets(
        self, *, pods: bool, rule: bool, node: bool, owners: bool
    ) -> list[EventTarget]:
        """Where a person looks (`kubectl describe`): Sickbay's DeviceTaintRule(s), the node,
        each consumer's top owner (Deployment / StatefulSet / Job / JobSet) and the pods that
        exist now (consumers still on the device, or live / Pending replacements), never an
        evicted one."""
        s = self._s
        out: list[EventTarget] = []
        q = s.quarantine.result
        if rule and q is not None and q.mode == "rule" and q.api_version:
            version = q.api_version if "/" in q.api_version else f"resource.k8s.io/{q.api_version}"
            for name in sorted(q.rule_uids) or ([q.rule_name] if q.rule_name else []):
                out.append(
                    EventTarget(
                        api_version=version,
                        kind="DeviceTaintRule",
                        name=name,
                        uid=q.rule_uids.get(name),
                    )
                )
        if node and s.confirm.device is not None:
            out.append(EventTarget(api_version="v1", kind="Node", name=s.confirm.device.node))
        if owners:
            seen: set[tuple[str, str, str]] = set()
            for c in s.confirm.consumers:
                o = c.top_owner or c.owner
                if o is None or o.kind not in OWNER_API_VERSIONS:
                    continue
                if (o.kind, o.namespace, o.name) in seen:
                    continue
                seen.add((o.kind, o.namespace, o.name))
                out.append(
                    EventTarget(
                        api_version=OWNER_API_VERSIONS[o.kind],
                        kind=o.kind,
                        name=o.name,
                        namespace=o.namespace,
                        uid=o.uid,
                    )
                )
        if pods:
            live = s.journal.live_pods
            if live is None:
                live = [c.pod for c in s.confirm.consumers if not c.terminating]
            for p in live:
                out.append(
                    EventTarget(
                        api_version="v1", kind="Pod", name=p.name, namespace=p.namespace, uid=p.uid
                    )
                )
        return out

    def event_beside(
        self,
        reason: str,
        message: str,
        *,
        etype: Literal["Normal", "Warning"] = "Normal",
        pods: bool = True,
        rule: bool = True,
        node: bool = True,
        owners: bool = True,
    ) -> None:
        """`event`, written while the steps after it run: nothing waits for the Kubernetes
        write but the next Event and the run's end (`events_written`). After the Event still
        on its way beside the steps, if any: one at a time, in the order decided."""
        before = self._s.journal.writing

        async def write() -> None:
            if before is not None:
                await before
            await self._write(
                reason, message, etype=etype, pods=pods, rule=rule, node=node, owners=owners
            )

        self._s.journal.writing = asyncio.ensure_future(write())

    async def events_written(self) -> None:
        """Wait for the Event written beside the steps, if one is on its way."""
        writing = self._s.journal.writing
        if writing is not None and writing is not asyncio.current_task():
            await writing

    async def event(
        self,
        reason: str,
        message: str,
        *,
        etype: Literal["Normal", "Warning"] = "Normal",
        pods: bool = True,
        rule: bool = True,
        node: bool = True,
        owners: bool = True,
    ) -> None:
        """A Kubernetes Event for one decision on every object a person would describe,
        aggregated (a repeat raises its count); failing to write it never stops the
        remediation. Dry runs write none: they change nothing in the cluster. Written after
        the Event on its way beside the steps (`event_beside`), if any."""
        await self.events_written()
        await self._write(
            reason, message, etype=etype, pods=pods, rule=rule, node=node, owners=owners
        )

    async def _write(
        self,
        reason: str,
        message: str,
        *,
        etype: Literal["Normal", "Warning"],
        pods: bool,
        rule: bool,
        node: bool,
        owners: bool,
    ) -> None:
        s = self._s
        if s.dry:
            return
        counted: list[EventTarget] = []
        for t in self.event_targets(pods=pods, rule=rule, node=node, owners=owners):
            key = f"{reason}|{t.kind}|{t.namespace or ''}|{t.name}"
            s.journal.event_counts[key] = s.journal.event_counts.get(key, 0) + 1
            counted.append(t.model_copy(update={"count": s.journal.event_counts[key]}))
        if not counted:
            return
        info = workflow.info()
        try:
            await self._calls.record_event(
                RecordEventInput(
                    targets=counted,
                    reason=reason,
                    message=f"GPU {s.status.device}: {message}"[:1000],
                    type=etype,
                    workflow_id=info.workflow_id,
                    aggregate=True,
                    series=f"{info.workflow_id}/{info.first_execution_run_id}",
                ),
                f"event {reason}",
            )
        except ACTIVITY_FAILED as err:
            self.log("Event not recorded", outcome="failed", reason=error_text(err))
