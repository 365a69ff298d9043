"""Which runbook applies to a device's consumers.

Pure functions used by the remediation workflow and by `sickbay runbooks explain`.

Per consumer, in this order:
1. a pod label `sickbay.dev/workload-class: <runbook>` pins that runbook;
2. else the same label on the pod's namespace;
3. else every runbook whose `match` rules all hold (namespaces, namespace labels, pod
   labels, owner kinds, priority classes; an empty `match` matches nothing) - the highest
   `precedence` among them;
4. else `default`.
Across consumers the strictest runbook - highest `precedence` - wins (ties: name order, so
the choice is stable). No consumers: the pinned runbook of the launch, else `default`.
A pin naming a runbook that does not exist is ignored with a note, never an error: a typo in
a label must not stop a remediation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from contract.kube import Consumer
from contract.names import LABEL_WORKLOAD_CLASS
from contract.runbook import Runbook, RunbookMatch, RunbookMetadata

DEFAULT_RUNBOOK = "default"


def builtin_default() -> Runbook:
    """Used only when no `default` runbook is loaded: every knob at its safe default."""
    return Runbook(
        api_version="sickbay/v1",
        kind="Runbook",
        metadata=RunbookMetadata(name=DEFAULT_RUNBOOK, description="built-in safe defaults"),
    )


@dataclass
class ConsumerChoice:
    pod: str  # namespace/name
    runbook: str
    why: str


@dataclass
class Selection:
    runbook: Runbook
    why: str
    per_consumer: list[ConsumerChoice] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _owner_kinds(consumer: Consumer) -> set[str]:
    return {o.kind for o in (consumer.owner, consumer.top_owner) if o is not None}


def matches(rule: RunbookMatch, consumer: Consumer) -> bool:
    if rule.empty:
        return False
    if rule.namespaces and consumer.pod.namespace not in rule.namespaces:
        return False
    if any(consumer.namespace_labels.get(k) != v for k, v in rule.namespace_labels.items()):
        return False
    if any(consumer.labels.get(k) != v for k, v in rule.pod_labels.items()):
        return False
    if rule.owner_kinds and not (_owner_kinds(consumer) & set(rule.owner_kinds)):
        return False
    return not (rule.priority_classes and consumer.priority_class not in rule.priority_classes)


def _strictest(candidates: list[Runbook]) -> Runbook:
    return sorted(candidates, key=lambda r: (-r.spec.precedence, r.name))[0]


def choose_for_consumer(
    runbooks: Sequence[Runbook], consumer: Consumer, notes: list[str] | None = None
) -> tuple[Runbook, str]:
    by_name = {r.name: r for r in runbooks}
    pod = f"{consumer.pod.namespace}/{consumer.pod.name}"
    for where, labels in (("pod", consumer.labels), ("namespace", consumer.namespace_labels)):
        pinned = labels.get(LABEL_WORKLOAD_CLASS)
        if not pinned:
            continue
        if pinned in by_name:
            return by_name[pinned], f"{where} label {LABEL_WORKLOAD_CLASS}={pinned}"
        if notes is not None:
            notes.append(
                f"{pod}: {where} label {LABEL_WORKLOAD_CLASS}={pinned} names no loaded "
                "runbook; ignored"
            )
    hits = [r for r in runbooks if r.name != DEFAULT_RUNBOOK and matches(r.spec.match, consumer)]
    if hits:
        best = _strictest(hits)
        others = ", ".join(r.name for r in hits if r is not best)
        why = f"match rules of {best.name}" + (f" (also matched: {others})" if others else "")
        return best, why
    return by_name.get(DEFAULT_RUNBOOK) or builtin_default(), "no pin and no match rule"


def select_runbook(
    runbooks: Sequence[Runbook], consumers: list[Consumer], pinned: str | None = None
) -> Selection:
    by_name = {r.name: r for r in runbooks}
    notes: list[str] = []
    if pinned:
        if pinned in by_name:
            return Selection(by_name[pinned], f"pinned by the launch: {pinned}", notes=notes)
        notes.append(f"launch pinned runbook {pinned!r}, which is not loaded; matching instead")
    choices: list[ConsumerChoice] = []
    chosen: list[Runbook] = []
    for consumer in consumers:
        runbook, why = choose_for_consumer(runbooks, consumer, notes)
        chosen.append(runbook)
        choices.append(
            ConsumerChoice(f"{consumer.pod.namespace}/{consumer.pod.name}", runbook.name, why)
        )
    if not chosen:
        default = by_name.get(DEFAULT_RUNBOOK) or builtin_default()
        return Selection(default, "no consumers on the device", notes=notes)
    best = _strictest(chosen)
    if len({r.name for r in chosen}) > 1:
        why = f"strictest of {sorted({r.name for r in chosen})} (precedence {best.spec.precedence})"
    else:
        why = next(c.why for c in choices if c.runbook == best.name)
    return Selection(best, why, choices, notes)
