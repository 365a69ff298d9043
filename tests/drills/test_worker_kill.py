"""Drill: one SIGKILL of the worker while seven remediations are parked at the seven phase
boundaries; a new worker finishes every one of them, nothing doubled.

A kill costs the step it interrupts a timeout (workflow task 10 s, notification 30 s
start-to-close, capacity 45 s and waits 60 s heartbeat), so the boundaries are not drilled one
after another: seven GPUs fail, each remediation is parked at its boundary, and one SIGKILL
hits all of them at once; the timeouts then run out in parallel.

The stand: 5 nodes x 2 GPUs in one pool (the twin cloud API may grow it to 6 nodes), twin and
demo runbooks 30x. Each workload is pinned to a node (nodeSelector / node affinity) so who
lands where is known. Drill runbooks (written next to the demo runbooks, pinned by the pod
label `sickbay.dev/workload-class`): `drill-hold` (long eviction timeout and Pending deadline,
no scale-up, release only when marked repaired), `drill-scale` (Pending deadline 3 s, scale-up
through the twin cloud API) and `drill-budget` (budget of 1 GPU per pool).
The twin's Alertmanager group interval is 1 s (alerts of one node are grouped; a GPU failing
next to an earlier one would otherwise wait 10 s for its group's next notification).

Parked at the kill, one GPU each:

| boundary     | how it is parked                                                              |
|--------------|-------------------------------------------------------------------------------|
| confirm      | the twin holds the evidence read (pod list of C's node; API fault `timeout`   |
|              | narrowed by `match`) inside the hot path's local activities                   |
| quarantine   | the twin holds every DeviceTaintRule create (API fault `timeout`)             |
| eviction wait| E's pod carries a finalizer: evicted, it stays terminating; `wait-eviction`   |
|              | (300 s timeout) runs                                                          |
| Pending wait | P's replacement is pinned to P's node, whose other GPU a filler pod holds;    |
|              | `wait-replacement` (300 s deadline) runs                                      |
| scale-up     | S's Pending deadline (3 s) passed; `request-capacity` waits on the pool       |
|              | scaler while the twin cloud API's resize runs (latency set to 50 s)           |
| escalation   | N's budget (1 GPU per pool) is exhausted: it escalates; the sink holds the    |
|              | page (fault rule: held 8 s, then 503, nothing recorded)                       |
| release      | R is marked repaired; the twin holds the delete of R's rule                   |

Right after the kill the drill checks each was still parked (held requests not yet answered
with success, the resize operation RUNNING, the page still held), starts a new worker, lifts
every hold (faults cleared, finalizer removed, filler deleted) and waits.

Asserted, counted from the twin, its cloud API and the sink: one successful DeviceTaintRule
create per quarantined GPU (six) and none for N, one successful delete per rule, no rule left;
one resize operation (S's need; P's was met by the freed GPU); exactly one page (trigger) for
N, none for anyone else, nothing through the webhook fallback; every remediation closed
(six released, N not quarantined) and one run per workflow id. Each workflow's history
proves the kill hit its step: a timed-out workflow task (C, Q, R: local activities) or the
step's activity finished by attempt >= 2 (E wait-eviction, P wait-replacement, S
request-capacity, N notify).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from contract.names import (
    ACT_NOTIFY,
    ACT_REQUEST_CAPACITY,
    ACT_WAIT_EVICTION,
    ACT_WAIT_REPLACEMENT,
    LABEL_WORKLOAD_CLASS,
    WF_REMEDIATE,
)
from contract.remediation import Phase, RemediationStatus
from harness.scenarios import Demo, WatchedRemediation
from tests.drills.conftest import Drill, closed, drill_stack, history_facts, run_count
from workflows.remediation import DeviceRemediationWorkflow

pytestmark = [pytest.mark.slow(seconds=90), pytest.mark.devserver]

NODES = [f"gpu-pool-node-{i}" for i in range(5)]
NEW_NODE = "gpu-pool-node-5"  # the node the scale-up adds (next free name in the pool)
HOLD_FINALIZER = "drill.sickbay.dev/hold"
# Held requests: the worker's Kubernetes client gives up after 10 s and its local activity
# retries 5 times, so a held hot-path / release step stays held for ~50 s; the drill parks the
# three of them and kills within ~15 s. 12 s > the client's 10 s: each attempt is held whole.
HELD_SECONDS = 12.0
# The page is held for 8 s, below the notify client's 10 s timeout: the kill lands while the
# sink still holds it (the drill kills within a poll, 0.2 s, of seeing it held).
PAGE_HOLD_SECONDS = 8.0
# The twin cloud API's resize runs 50 s (1,500 simulated s at 30x): the other boundaries are
# parked within seconds of S's resize starting (15 s under load), and it ends before S's
# request-capacity is retried anyway (45 s heartbeat timeout + 10 s backoff after the kill).
RESIZE_SECONDS = 50.0
# A killed wait is retried after its 60 s heartbeat timeout (+5 s backoff), request-capacity
# after 45 s (+10 s) and the resize's end, the page after 30 s (+10 s); plus worker start-up
# on a loaded 2-core machine.
AFTER_KILL = 180.0
PARKING = 60.0  # each park takes 1-15 s (alert -> webhook -> workflow, scaler batch window)


def drill_runbooks(d: Drill) -> None:
    common: dict[str, Any] = {
        "confirm": {"staleAfter": "1h"},
        "quarantine": {"effect": "NoExecute"},
        "budget": {
            "maxPerPool": "100%",
            "maxPerCluster": "100%",
            "unsafe": ["maxPerPool", "maxPerCluster"],  # a 2-GPU stand: both may go
        },
        "escalation": {"channels": ["pagerduty"], "severity": "critical"},
        "release": {"mode": "repaired"},  # no health checks: no extra reads while parked
    }
    d.write_runbook(
        "drill-hold",
        {
            **common,
            "eviction": {"mode": "taint", "timeout": "300s", "force": "none"},
            "replacement": {"pendingDeadline": "300s"},
            "scaleUp": {"enabled": False},
        },
    )
    d.write_runbook(
        "drill-scale",
        {
            **common,
            "eviction": {"mode": "taint", "timeout": "300s", "force": "none"},
            "replacement": {"pendingDeadline": "3s", "unsafe": ["pendingDeadline"]},
            "scaleUp": {
                "enabled": True,
                "pool": d.twin_pool(),
                "step": 1,
                "maxSize": 6,
                "capacityDeadline": "300s",
            },
        },
    )
    d.write_runbook(
        "drill-budget",
        {
            **common,
            "budget": {"maxPerPool": 1, "maxPerCluster": "100%", "unsafe": ["maxPerCluster"]},
        },
    )


def pod_spec(demo: Demo, app: str, runbook: str, node: str | None) -> dict[str, Any]:
    template = demo.pod_template(app, {LABEL_WORKLOAD_CLASS: runbook})
    if node is not None:
        template["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return template


async def deployment(
    demo: Demo, ns: str, app: str, runbook: str, node: str | None, nodes_in: Sequence[str] = ()
) -> None:
    template = pod_spec(demo, app, runbook, node)
    if nodes_in:
        term = {"key": "kubernetes.io/hostname", "operator": "In", "values": list(nodes_in)}
        template["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [term]}]
                }
            }
        }
    await demo.deployment(ns, app, template=template)


async def bare_pod(demo: Demo, ns: str, app: str, runbook: str, node: str) -> None:
    template = pod_spec(demo, app, runbook, node)
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": app, **template["metadata"]}}
    body["spec"] = template["spec"]
    await demo.k("POST", f"/api/v1/namespaces/{ns}/pods", body)


async def merge_patch(demo: Demo, path: str, patch: dict[str, Any]) -> None:
    r = await demo.kube.patch(
        path,
        content=json.dumps(patch),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert r.status_code < 300, f"PATCH {path} -> {r.status_code}: {r.text[:300]}"


async def workload(demo: Demo, ns: str, app: str) -> dict[str, Any]:
    """The twin's GPU under the (one) running pod of `app`."""
    [(_, device)] = await demo.running(ns, app)
    return await demo.gpu(device)


async def started(demo: Demo, gpu: dict[str, Any]) -> str:
    wf_id = demo.workflow_id(gpu)

    async def probe() -> bool:
        return (await demo.handle(wf_id).describe()).workflow_type == WF_REMEDIATE

    await demo.until(f"remediation {wf_id} to start", probe)
    return wf_id


async def status(demo: Demo, wf_id: str) -> RemediationStatus:
    return await demo.handle(wf_id).query(DeviceRemediationWorkflow.status)


async def reach(
    demo: Demo, wf_id: str, phases: set[Phase], within: float, awaiting: str = ""
) -> RemediationStatus:
    """Poll the remediation's status until it is in one of `phases` (and, if given, its
    `awaiting` starts with `awaiting`); fail at once if it closed or escalated unexpectedly."""

    async def probe() -> RemediationStatus | None:
        st = await status(demo, wf_id)
        if st.phase not in phases and st.phase in (Phase.CLOSED, Phase.ESCALATED):
            raise AssertionError(
                f"{wf_id} is {st.phase.value} ({st.escalation_reason or st.outcome}) instead of "
                f"{'/'.join(sorted(p.value for p in phases))}"
            )
        if st.phase in phases and st.awaiting.startswith(awaiting):
            return st
        return None

    wanted = "/".join(sorted(p.value for p in phases))
    return await demo.until(f"{wf_id} to reach {wanted} {awaiting}".rstrip(), probe, within)


def ok_requests(d: Drill, verb: str) -> list[dict[str, Any]]:
    return [
        r
        for r in d.kube_requests(verb=verb, resource="devicetaintrules")
        if 200 <= r["status"] < 300
    ]


def pages(d: Drill) -> list[dict[str, Any]]:
    return [n for n in d.notifications() if n["kind"] == "pagerduty"]


async def test_one_sigkill_at_every_phase_boundary(tmp_path: Path) -> None:
    t0 = time.monotonic()
    async with drill_stack(tmp_path, nodes=5, gpus_per_node=2, pool_max=6) as d:
        demo = d.demo
        drill_runbooks(d)
        # The twin's Alertmanager groups alerts per (alertname, node): a GPU failing on a node
        # with an earlier alert waits for the group interval (5 simulated min = 10 s here).
        # 1 s instead, so the short parks below take seconds.
        d.stack.twin("PUT", "/twin/alerts", {"groupInterval": 30})
        for ns in ("drill-r", "drill-e", "drill-p", "drill-s", "drill-q", "drill-c", "drill-n"):
            await demo.namespace(ns)
        # Placement: node-0 R (+ its replacement), node-1 E (+ its replacement), node-2 P and
        # a filler, node-3 S then N, node-4 C and Q. S may also run on the node the scale-up
        # adds; nothing else can.
        await deployment(demo, "drill-r", "r", "drill-hold", NODES[0])
        await deployment(demo, "drill-e", "e", "drill-hold", NODES[1])
        await deployment(demo, "drill-p", "p", "drill-hold", NODES[2])
        gpu_r = await workload(demo, "drill-r", "r")
        gpu_e = await workload(demo, "drill-e", "e")
        gpu_p = await workload(demo, "drill-p", "p")
        await bare_pod(demo, "drill-p", "filler", "drill-hold", NODES[2])
        await deployment(demo, "drill-s", "s", "drill-scale", None, [NODES[3], NEW_NODE])
        gpu_s = await workload(demo, "drill-s", "s")
        await bare_pod(demo, "drill-n", "n", "drill-budget", NODES[3])
        await bare_pod(demo, "drill-c", "c", "drill-hold", NODES[4])
        await bare_pod(demo, "drill-q", "q", "drill-hold", NODES[4])
        await demo.running("drill-p", "filler")
        gpu_n = await workload(demo, "drill-n", "n")
        gpu_c = await workload(demo, "drill-c", "c")
        gpu_q = await workload(demo, "drill-q", "q")
        assert [g["node"] for g in (gpu_r, gpu_e, gpu_p, gpu_s, gpu_n, gpu_c, gpu_q)] == [
            NODES[0],
            NODES[1],
            NODES[2],
            NODES[3],
            NODES[3],
            NODES[4],
            NODES[4],
        ]
        [(e_pod, _)] = await demo.running("drill-e", "e")
        e_path = f"/api/v1/namespaces/drill-e/pods/{e_pod['metadata']['name']}"
        await merge_patch(demo, e_path, {"metadata": {"finalizers": [HOLD_FINALIZER]}})
        print(f"[{time.monotonic() - t0:5.0f}s] stand ready", flush=True)

        # -- long parks: release's precondition, eviction wait, Pending wait, scale-up -------
        await demo.fail(gpu_r)
        wf_r = await started(demo, gpu_r)
        st_r = await reach(demo, wf_r, {Phase.HOLDING}, PARKING)
        await demo.running("drill-r", "r")  # its replacement, on node-0's other GPU
        await demo.fail(gpu_e)
        wf_e = await started(demo, gpu_e)
        await reach(demo, wf_e, {Phase.EVICTING}, PARKING)
        await demo.fail(gpu_p)
        wf_p = await started(demo, gpu_p)
        await reach(demo, wf_p, {Phase.AWAITING_REPLACEMENT}, PARKING)
        d.cloud_latency(RESIZE_SECONDS * 30)  # simulated seconds at 30x
        await demo.fail(gpu_s)
        wf_s = await started(demo, gpu_s)
        await reach(demo, wf_s, {Phase.SCALING}, PARKING, awaiting="node-pool capacity")

        async def resize_running() -> bool:
            return any(op["status"] == "RUNNING" for op in d.resize_operations())

        await demo.until("the twin cloud API's resize to start", resize_running, PARKING)
        print(f"[{time.monotonic() - t0:5.0f}s] E, P, S parked; R holding", flush=True)

        # -- short parks (a held local activity gives up after ~50 s): release, quarantine,
        # confirm, then the escalation (held 8 s) and the kill right away ---------------------
        rule_r = st_r.rule_name or ""
        assert rule_r, st_r
        hold_r = d.api_fault(
            "timeout", "delete", "devicetaintrules", timeoutSeconds=HELD_SECONDS, match=rule_r
        )
        await demo.repaired(_incident(wf_r), actor="drill")
        await demo.until("R's rule delete to be held", _hit(d, hold_r), PARKING)
        short_from = time.monotonic()
        hold_q = d.api_fault("timeout", "create", "devicetaintrules", timeoutSeconds=HELD_SECONDS)
        await demo.fail(gpu_q)
        wf_q = await started(demo, gpu_q)
        await demo.until("Q's rule create to be held", _hit(d, hold_q), PARKING)
        print(f"[{time.monotonic() - t0:5.0f}s] R, Q held", flush=True)
        hold_c = d.api_fault(
            "timeout",
            "list",
            "pods",
            timeoutSeconds=HELD_SECONDS,
            match=f"spec.nodeName={NODES[4]}",
        )
        await demo.fail(gpu_c)
        wf_c = await started(demo, gpu_c)
        await demo.until("C's evidence read to be held", _hit(d, hold_c), PARKING)
        creates_before = len(ok_requests(d, "create"))
        assert creates_before == 4, "R, E, P, S tainted; Q and C held before their rule"
        parked = {
            "eviction wait": await status(demo, wf_e),
            "Pending wait": await status(demo, wf_p),
            "scale-up": await status(demo, wf_s),
        }
        assert [(st.phase, st.awaiting.split(" (")[0]) for st in parked.values()] == [
            (Phase.EVICTING, "1 consumer(s) to go"),
            (Phase.AWAITING_REPLACEMENT, "replacements Running"),
            (Phase.SCALING, "node-pool capacity"),
        ], parked
        d.sink_fault("/v2/enqueue", count=1, hold_seconds=PAGE_HOLD_SECONDS)
        await demo.fail(gpu_n)
        wf_n = await started(demo, gpu_n)

        async def page_held() -> bool:
            return any(f["holding"] for f in d.sink_faults())

        await demo.until("N's page to be held by the sink", page_held, PARKING)
        assert d.kill_worker() == 1
        killed_at = time.monotonic()
        print(
            f"[{killed_at - t0:5.0f}s] C, N held; SIGKILL {killed_at - short_from:.0f} s after "
            "the first held local activity (it gives up after ~50 s)",
            flush=True,
        )

        # -- still parked at the kill? (nothing can move without a worker) -------------------
        assert [f["holding"] for f in d.sink_faults()] == [1], "the page was in flight"
        assert any(op["status"] == "RUNNING" for op in d.resize_operations())
        assert len(d.resize_operations()) == 1
        assert len(ok_requests(d, "create")) == creates_before, "Q, C not tainted yet"
        assert ok_requests(d, "delete") == [], "R's rule not deleted yet"
        assert pages(d) == []
        # E's step waits for its pod to go (the finalizer keeps it), P's for a replacement
        # Running (the filler keeps the only GPU it may use): both still as parked.
        terminating = await demo.k("GET", e_path)
        assert terminating["metadata"].get("deletionTimestamp"), "E's pod is evicted ..."
        assert not [
            p for p in await demo.pods("drill-p", "p") if p["status"].get("phase") == "Running"
        ], "P's replacement is still Pending"

        # -- a new worker; every hold lifted ------------------------------------------------
        d.start_worker()
        d.clear_api_faults()
        d.clear_sink_faults()
        await merge_patch(demo, e_path, {"metadata": {"finalizers": None}})
        await demo.k("DELETE", "/api/v1/namespaces/drill-p/pods/filler")

        st_r_closed = await closed(demo, _incident(wf_r), within=AFTER_KILL)
        assert st_r_closed.outcome == "released", (st_r_closed.outcome, st_r_closed.reason)
        for wf_id in (wf_q, wf_c, wf_e, wf_p, wf_s):
            await reach(demo, wf_id, {Phase.HOLDING}, AFTER_KILL)
        await reach(demo, wf_n, {Phase.ESCALATED}, AFTER_KILL)

        async def page_delivered() -> bool:
            return any(p["body"].get("event_action") == "trigger" for p in pages(d))

        await demo.until("N's page to be delivered", page_delivered, AFTER_KILL)
        recovered = time.monotonic() - killed_at
        print(f"[{time.monotonic() - t0:5.0f}s] all resumed {recovered:.0f} s after the kill")
        [(_, device_s)] = await demo.running("drill-s", "s")
        assert f"/{NEW_NODE}/" in device_s, f"S's replacement runs on {device_s}"
        await demo.running("drill-p", "p")  # on the freed GPU
        await demo.running("drill-e", "e")

        # N first: once the others release, a budget slot would free up for it.
        await demo.repaired(_incident(wf_n), actor="drill")
        results = {wf_r: st_r_closed, wf_n: await closed(demo, _incident(wf_n), within=60)}
        for wf_id in (wf_q, wf_c, wf_e, wf_p, wf_s):
            await demo.repaired(_incident(wf_id), actor="drill")
        for wf_id in (wf_q, wf_c, wf_e, wf_p, wf_s):
            results[wf_id] = await closed(demo, _incident(wf_id), within=60)

        # -- the invariants ---------------------------------------------------------------------
        outcomes = {wf_id: r.outcome for wf_id, r in results.items()}
        assert outcomes == {
            wf_r: "released",
            wf_q: "released",
            wf_c: "released",
            wf_e: "released",
            wf_p: "released",
            wf_s: "released",
            wf_n: "not-quarantined",
        }, {w: (r.outcome, r.reason) for w, r in results.items()}
        assert results[wf_n].status.escalation_reason == "budget-exhausted"
        for wf_id in results:
            assert await run_count(demo, wf_id) == 1, f"{wf_id} ran more than once"
        tainted = {wf_r, wf_q, wf_c, wf_e, wf_p, wf_s}
        rule_names = {results[w].status.rule_name for w in tainted}
        assert len(rule_names) == 6 and None not in rule_names
        assert results[wf_n].status.rule_name is None, "N was never tainted"
        assert len(ok_requests(d, "create")) == 6, "exactly one taint per GPU"
        deletes = sorted(r["name"] for r in ok_requests(d, "delete"))
        assert deletes == sorted(rule_names), f"one successful delete per rule: {deletes}"
        assert d.rules() == []
        ops = d.resize_operations()
        assert len(ops) == 1 and ops[0]["status"] == "DONE", ops
        assert NEW_NODE in await demo.nodes()
        sent = d.notifications()
        assert [n["kind"] for n in sent] == ["pagerduty", "pagerduty"], sent
        actions = [(n["body"]["event_action"], n["body"]["dedup_key"][:40]) for n in sent]
        assert actions == [("trigger", wf_n[:40]), ("resolve", wf_n[:40])], actions

        # -- and the kill did interrupt each step ---------------------------------------------
        facts = {wf_id: await history_facts(demo, wf_id) for wf_id in results}
        for who, wf_id in (("release", wf_r), ("quarantine", wf_q), ("confirm", wf_c)):
            assert facts[wf_id].workflow_task_timeouts >= 1, (who, facts[wf_id])
        for who, wf_id, activity in (
            ("eviction wait", wf_e, ACT_WAIT_EVICTION),
            ("Pending wait", wf_p, ACT_WAIT_REPLACEMENT),
            ("scale-up", wf_s, ACT_REQUEST_CAPACITY),
            ("escalation", wf_n, ACT_NOTIFY),
        ):
            assert facts[wf_id].attempts.get(activity, 0) >= 2, (who, facts[wf_id])
        print(
            f"[{time.monotonic() - t0:5.0f}s] seven boundaries, one kill: all closed; "
            f"resumed {recovered:.0f} s after SIGKILL"
        )
        names = {wf_r: "R", wf_q: "Q", wf_c: "C", wf_e: "E", wf_p: "P", wf_s: "S", wf_n: "N"}
        for wf_id, f in facts.items():
            print(
                f"  {names[wf_id]}: {f.workflow_task_timeouts} workflow task(s) timed out, {f.attempts}"
            )


def _incident(workflow_id: str) -> WatchedRemediation:
    """What Demo.repaired / conftest.closed need (no phase watcher: the drill polls itself)."""
    return WatchedRemediation(workflow_id, device="", title="")


def _hit(d: Drill, rule_id: int) -> Any:
    async def probe() -> bool:
        return d.api_fault_hits(rule_id) >= 1

    return probe
