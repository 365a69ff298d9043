"""Device-taint eviction (kube-controller-manager's device-taint-eviction-controller, 1.35+).

Evicts pods that use a device with a NoExecute taint they do not tolerate:
- taints come from ResourceSlices (driver-published) and from DeviceTaintRules (merged in
  memory, never written back to slices);
- a pod is a candidate when it is scheduled, references the claim (pod.status.
  resourceClaimStatuses or spec.resourceClaims[].resourceClaimName) and is in the allocated
  claim's `reservedFor`;
- tolerations come from the claim's allocation results (copied from the request by the
  scheduler); with `tolerationSeconds` the pod goes at `timeAdded + seconds`;
- eviction = an Event `DeviceTaintManagerEviction` "Marking for deletion" (core/v1, component
  device-taint-eviction-controller), a `DisruptionTarget=True` condition with reason
  `DeletionByDeviceTaintManager` and message "Device Taint manager: deleting due to NoExecute
  taint", then a graceful delete with the pod's own grace period. PodDisruptionBudgets are not
  consulted, as in Kubernetes.

DeviceTaintRule status (condition `EvictionInProgress`, golden 35/41/48/50/55):
- NoExecute: right after creation `True`/`PodsPendingEviction` "1 pod needs to be evicted in
  1 namespace." (computed before that pass's evictions, as the real controller does); then at
  most every `rule_status_period` (10 s) `False`/`Completed` "1 pod evicted since starting
  the controller." once nothing is pending (a pod still Terminating counts as evicted);
- None: once, `False`/`NoEffect` with device and pod counts ("... This information will not be
  updated again. Recreate the DeviceTaintRule to trigger an update.");
- NoSchedule: `False`/`OtherEffect` "Eviction only happens for the NoExecute effect.".
`observedGeneration` is set; a changed generation recomputes at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from twin.controllers.allocator import (
    DeviceId,
    claim_devices,
    rule_selects,
    rule_taint,
    toleration_deadline,
    toleration_matches,
)
from twin.controllers.common import (
    CLAIMS,
    PODS,
    SLICES,
    TAINT_RULES,
    is_deleting,
    is_terminal,
    meta,
    name_of,
    ns_of,
    set_condition,
    uid_of,
)
from twin.errors import ApiError

log = logging.getLogger(__name__)

COMPONENT = "device-taint-eviction-controller"
CONDITION = "EvictionInProgress"
DISRUPTION_MESSAGE = "Device Taint manager: deleting due to NoExecute taint"


def _plural(count: int, singular: str, plural: str) -> str:
    return f"{count} {singular if count == 1 else plural}"


def pending_message(pods: int, namespaces: int, evicted: int) -> str:
    verb = "needs" if pods == 1 else "need"
    where = "1 namespace" if namespaces == 1 else f"{namespaces} different namespaces"
    text = f"{_plural(pods, 'pod', 'pods')} {verb} to be evicted in {where}."
    if evicted:
        text += f" {evicted_message(evicted)}"
    return text


def evicted_message(evicted: int) -> str:
    return f"{_plural(evicted, 'pod', 'pods')} evicted since starting the controller."


def no_effect_message(published: int, allocated: int, pods: int, namespaces: int) -> str:
    return (
        f"{_plural(published, 'published device', 'published devices')} selected. "
        f"{_plural(allocated, 'allocated device', 'allocated devices')} selected. "
        f"{_plural(pods, 'pod', 'pods')} would be evicted in "
        f"{_plural(namespaces, 'namespace', 'namespaces')} if the effect was NoExecute. "
        "This information will not be updated again. Recreate the DeviceTaintRule to trigger "
        "an update."
    )


@dataclass
class _RuleState:
    evicted: int = 0
    last_write: float | None = None
    generation: int = 0
    done: bool = False  # None/NoSchedule rules are written once per generation


@dataclass
class _Candidate:
    pod: dict[str, Any]
    due: datetime | None  # None: tolerated forever
    rules: set[str] = field(default_factory=set)  # rule uids behind the untolerated taints


class DeviceTaintEviction:
    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self._rules: dict[str, _RuleState] = {}
        # slice uid -> (resourceVersion, its devices, their taints)
        self._slices: dict[
            str, tuple[Any, list[DeviceId], dict[DeviceId, list[dict[str, Any]]]]
        ] = {}
        self.evictions = 0  # pods marked for deletion since start (all taints)

    def sync(self, ctx: Any) -> float | None:
        store = ctx.store
        if not ctx.dra:
            return None
        try:
            rules = store.list(TAINT_RULES, copy_objects=False).items
        except ApiError:
            rules = []
        slices = store.list(SLICES, copy_objects=False).items
        claims = store.list(CLAIMS, copy_objects=False).items
        slice_taints: dict[DeviceId, list[dict[str, Any]]] = {}
        published: list[DeviceId] = []
        seen: set[str] = set()
        for piece in slices:
            devices, taints = self._slice_devices(piece)
            seen.add(uid_of(piece))
            published.extend(devices)
            slice_taints.update(taints)
        for uid in self._slices.keys() - seen:
            del self._slices[uid]
        candidates, consumers = self._candidates(ctx, rules, claims, slice_taints)
        # Status first: the real controller reports the pending count before evicting.
        earliest = self._rule_statuses(ctx, rules, published, claims, candidates, consumers)
        for cand in candidates.values():
            if cand.due is None:
                continue
            if cand.due > ctx.now:
                wait = (cand.due - ctx.now).total_seconds()
                earliest = wait if earliest is None else min(earliest, wait)
                continue
            if self._evict(ctx, cand.pod):
                for rule_uid in cand.rules:
                    self._rules.setdefault(rule_uid, _RuleState()).evicted += 1
        live = {uid_of(r) for r in rules}
        for uid in list(self._rules):
            if uid not in live:
                del self._rules[uid]
        return earliest

    def _slice_devices(
        self, piece: dict[str, Any]
    ) -> tuple[list[DeviceId], dict[DeviceId, list[dict[str, Any]]]]:
        """A slice's devices and their taints, read again only when the slice changed (its
        resourceVersion): a pass on a 1,000-node cluster otherwise rebuilds 8,000 ids."""
        uid, version = uid_of(piece), meta(piece).get("resourceVersion")
        hit = self._slices.get(uid)
        if hit is not None and hit[0] == version:
            return hit[1], hit[2]
        spec = piece.get("spec") or {}
        driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
        devices: list[DeviceId] = []
        taints: dict[DeviceId, list[dict[str, Any]]] = {}
        for dev in spec.get("devices") or []:
            dev_id = DeviceId(driver, pool, dev.get("name", ""))
            devices.append(dev_id)
            found = (dev.get("basic", dev)).get("taints") or []
            if found:
                taints[dev_id] = [dict(t) for t in found]
        self._slices[uid] = (version, devices, taints)
        return devices, taints

    # -- which pods must go ----------------------------------------------------------------

    def _candidates(
        self,
        ctx: Any,
        rules: list[dict[str, Any]],
        claims: list[dict[str, Any]],
        slice_taints: dict[DeviceId, list[dict[str, Any]]],
    ) -> tuple[dict[str, _Candidate], dict[str, list[tuple[dict[str, Any], dict[str, Any]]]]]:
        """Pods to evict (uid -> candidate) and, per rule uid, the (pod, allocation result) pairs
        it selects."""
        effect_rules = [
            (r, rule_taint(r))
            for r in rules
            if (r.get("spec") or {}).get("taint", {}).get("effect")
        ]
        out: dict[str, _Candidate] = {}
        consumers: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
        for claim in claims:
            devices = claim_devices(claim)
            if not devices:
                continue
            for ref in (claim.get("status") or {}).get("reservedFor") or []:
                # The stored pod, looked up by name (not a dict of every pod per pass: on a
                # cluster of 8,000 pods building it was most of a pass).
                pod = ctx.store.get_ref(PODS, ref.get("name", ""), ns_of(claim))
                if pod is None or uid_of(pod) != ref.get("uid") or not pod["spec"].get("nodeName"):
                    continue
                if is_terminal(pod) or not self._references(pod, name_of(claim)):
                    continue
                for dev_id, result in devices:
                    taints: list[tuple[dict[str, Any], str | None]] = [
                        (t, None) for t in slice_taints.get(dev_id, [])
                    ]
                    for rule, taint in effect_rules:
                        if rule_selects(rule, dev_id):
                            consumers.setdefault(uid_of(rule), []).append((pod, result))
                            taints.append((taint, uid_of(rule)))
                    for taint, rule_uid in taints:
                        if taint.get("effect") != "NoExecute":
                            continue
                        due = self._due(taint, result.get("tolerations") or [], ctx.now)
                        if due is False:
                            continue
                        assert isinstance(due, datetime)
                        cand = out.get(uid_of(pod))
                        if cand is None:
                            cand = out[uid_of(pod)] = _Candidate(pod, due)
                        elif cand.due is None or due < cand.due:
                            cand.due = due
                        if rule_uid:
                            cand.rules.add(rule_uid)
        return out, consumers

    @staticmethod
    def _due(
        taint: dict[str, Any], tolerations: list[dict[str, Any]], now: datetime
    ) -> datetime | bool:
        """When the taint evicts: `now` (untolerated), a later deadline, or False (never)."""
        latest: datetime | None = None
        for tol in tolerations:
            if not toleration_matches(tol, taint):
                continue
            until = toleration_deadline(tol, taint)
            if until is None:
                return False  # tolerated without a time limit
            latest = until if latest is None else max(latest, until)
        return now if latest is None else latest

    @staticmethod
    def _references(pod: dict[str, Any], claim_name: str) -> bool:
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            if status.get("resourceClaimName") == claim_name:
                return True
        return any(
            entry.get("resourceClaimName") == claim_name
            for entry in pod["spec"].get("resourceClaims") or []
        )

    # -- eviction ----------------------------------------------------------------------------

    def _evict(self, ctx: Any, pod: dict[str, Any]) -> bool:
        if is_deleting(pod):
            return False  # already on its way out (by us or anyone else)
        store = ctx.store

        def disrupt(obj: dict[str, Any]) -> None:
            set_condition(
                obj.setdefault("status", {}),
                "DisruptionTarget",
                "True",
                ctx.now,
                "DeletionByDeviceTaintManager",
                DISRUPTION_MESSAGE,
                probe=True,
            )

        try:
            ctx.events.controller(
                pod,
                COMPONENT,
                "DeviceTaintManagerEviction",
                "Marking for deletion",
                with_version=False,
            )
            store.mutate(PODS, name_of(pod), disrupt, ns_of(pod), subresource="status")
            store.delete(PODS, name_of(pod), ns_of(pod))
        except ApiError as err:
            log.info("eviction of %s/%s: %s", ns_of(pod), name_of(pod), err.message)
            return False
        self.evictions += 1
        log.info("evicted %s/%s (NoExecute device taint)", ns_of(pod), name_of(pod))
        return True

    # -- DeviceTaintRule status --------------------------------------------------------------

    def _rule_statuses(
        self,
        ctx: Any,
        rules: list[dict[str, Any]],
        published: list[DeviceId],
        claims: list[dict[str, Any]],
        candidates: dict[str, _Candidate],
        consumers: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]],
    ) -> float | None:
        earliest: float | None = None
        period = ctx.options.rule_status_period
        for rule in rules:
            rule_uid = uid_of(rule)
            generation = int(meta(rule).get("generation", 1))
            state = self._rules.setdefault(rule_uid, _RuleState())
            if state.generation != generation:
                state.generation, state.done, state.last_write = generation, False, None
            effect = ((rule.get("spec") or {}).get("taint") or {}).get("effect")
            if effect != "NoExecute":
                if state.done:
                    continue
                if effect == "None":
                    selected = [d for d in published if rule_selects(rule, d)]
                    allocated = {
                        d for c in claims for d, _ in claim_devices(c) if rule_selects(rule, d)
                    }
                    # Pods that would go if the effect was NoExecute: not tolerating it forever.
                    as_noexecute = {**rule_taint(rule), "effect": "NoExecute"}
                    pods = {
                        uid_of(p): p
                        for p, result in consumers.get(rule_uid, [])
                        if self._due(as_noexecute, result.get("tolerations") or [], ctx.now)
                        is not False
                    }
                    namespaces = {ns_of(p) for p in pods.values()}
                    reason = "NoEffect"
                    message = no_effect_message(
                        len(selected), len(allocated), len(pods), len(namespaces)
                    )
                else:
                    reason, message = (
                        "OtherEffect",
                        "Eviction only happens for the NoExecute effect.",
                    )
                self._write(ctx, rule, "False", reason, message, generation)
                state.done = True
                continue
            if state.last_write is not None and ctx.mono < state.last_write + period:
                wait = state.last_write + period - ctx.mono
                earliest = wait if earliest is None else min(earliest, wait)
                continue
            pending = [
                c.pod for c in candidates.values() if rule_uid in c.rules and not is_deleting(c.pod)
            ]
            if pending:
                namespaces = {ns_of(p) for p in pending}
                status, reason = "True", "PodsPendingEviction"
                message = pending_message(len(pending), len(namespaces), state.evicted)
            else:
                status, reason, message = "False", "Completed", evicted_message(state.evicted)
            changed = self._write(ctx, rule, status, reason, message, generation)
            if changed or state.last_write is None:
                state.last_write = ctx.mono
            if status == "True" or changed:
                earliest = period if earliest is None else min(earliest, period)
        return earliest

    def _write(
        self,
        ctx: Any,
        rule: dict[str, Any],
        status: str,
        reason: str,
        message: str,
        generation: int,
    ) -> bool:
        current = dict(rule.get("status") or {})
        probe = {"conditions": [dict(c) for c in current.get("conditions") or []]}
        if not set_condition(
            probe, CONDITION, status, ctx.now, reason, message, observed_generation=generation
        ):
            return False

        def update(obj: dict[str, Any]) -> None:
            st = obj.setdefault("status", {})
            set_condition(
                st, CONDITION, status, ctx.now, reason, message, observed_generation=generation
            )

        try:
            ctx.store.mutate(
                TAINT_RULES, name_of(rule), update, subresource="status", manager=COMPONENT
            )
        except ApiError as err:
            log.debug("rule %s status: %s", name_of(rule), err.message)
            return False
        return True
