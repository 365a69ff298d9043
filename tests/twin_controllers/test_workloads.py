"""Workload controllers through the official client.

Cases:
- Job with podFailurePolicy FailJob on exit code 42: one pod, exits 42, the Job fails at once
  (reason PodFailurePolicy, the real message), no retry despite backoffLimit 6;
- Job without a policy: exit 1 twice with backoffLimit 1 -> Failed, BackoffLimitExceeded;
- Job with restartPolicy OnFailure: the container restarts in place and the restarts count
  toward backoffLimit;
- Job succeeding: Complete with completionTime, succeeded 1, pod finalizer removed;
- podFailurePolicy Ignore on DisruptionTarget: an evicted pod does not count as a failure and
  is replaced;
- a deleted Job's running pod is removed (its tracking finalizer released) with its claim;
- StatefulSet: an evicted pod comes back under the same name only once the old one is gone;
- Deployment events have the shapes of a real cluster (golden 42): ScalingReplicaSet from the
  deployment-controller, SuccessfulCreate from the replicaset-controller (core/v1 style with
  count and timestamps), Scheduled from default-scheduler (eventTime, action Binding).
"""

from __future__ import annotations

from typing import Any

from tests.twin_controllers.conftest import eventually
from tests.twin_controllers.helpers import (
    claim_template,
    condition,
    deployment,
    pod_template,
    pods,
    taint_rule,
)

NODE = "gpu-pool-node-0"


def _job(
    name: str, exit_code: int, policy: dict[str, Any] | None = None, backoff: int = 6
) -> dict[str, Any]:
    template = pod_template({"app": name}, "gpu", restartPolicy="Never")
    template["metadata"]["annotations"] = {
        "twin.sickbay.dev/run-seconds": "5",
        "twin.sickbay.dev/exit-code": str(exit_code),
    }
    spec: dict[str, Any] = {"backoffLimit": backoff, "template": template}
    if policy:
        spec["podFailurePolicy"] = policy
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def _job_condition(t: Any, ns: str, name: str, ctype: str) -> Any:
    job = t.batch.read_namespaced_job(name, ns)
    cond = next((c for c in job.status.conditions or [] if c.type == ctype), None)
    assert cond is not None and cond.status == "True", job.status
    return job, cond


def test_job_exit_code_42_fails_fast(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    policy = {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}
    t.batch.create_namespaced_job(ns, _job("train", 42, policy))
    job, cond = eventually(lambda: _job_condition(t, ns, "train", "Failed"))
    assert cond.reason == "PodFailurePolicy"
    (pod,) = pods(t.core, ns)  # exactly one pod: no retry
    assert cond.message == (
        f"Container main for pod {ns}/{pod.metadata.name} failed with exit code 42 matching "
        "FailJob rule at index 0"
    )
    assert job.status.failed == 1 and not job.status.active
    assert pod.status.phase == "Failed"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 42
    assert "batch.kubernetes.io/job-tracking" not in (pod.metadata.finalizers or [])
    # The finished pod gives its device back: its generated claim is deleted.
    eventually(lambda: not t.dra.list_namespaced_resource_claim(ns).items)


def test_job_backoff_limit(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    t.batch.create_namespaced_job(ns, _job("flaky", 1, backoff=1))
    job, cond = eventually(lambda: _job_condition(t, ns, "flaky", "Failed"))
    assert (cond.reason, cond.message) == (
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
    )
    assert job.status.failed == 2
    assert len(pods(t.core, ns)) == 2


def test_job_completes(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    t.batch.create_namespaced_job(ns, _job("ok", 0))
    job, cond = eventually(lambda: _job_condition(t, ns, "ok", "Complete"))
    assert job.status.succeeded == 1 and job.status.completion_time is not None
    (pod,) = pods(t.core, ns)
    assert pod.status.phase == "Succeeded"


def test_job_ignores_disruption(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    policy = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    job = _job("resilient", 0, policy, backoff=0)
    job["spec"]["template"]["metadata"]["annotations"]["twin.sickbay.dev/run-seconds"] = "3600"
    t.batch.create_namespaced_job(ns, job)

    def running() -> Any:
        (p,) = pods(t.core, ns)
        assert p.status.phase == "Running"
        return p

    first = eventually(running)
    t.dra_beta2.create_device_taint_rule(taint_rule("gpu0", NODE, "gpu-0"))

    def replaced() -> bool:
        live = [p for p in pods(t.core, ns) if p.metadata.name != first.metadata.name]
        assert live and live[0].status.phase == "Running"
        assert first.metadata.name not in {p.metadata.name for p in pods(t.core, ns)}
        return True

    eventually(replaced)
    status = t.batch.read_namespaced_job("resilient", ns).status
    assert not status.failed and not any(c.type == "Failed" for c in status.conditions or [])


def test_statefulset_pod_returns_with_same_name(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    labels = {"app": "db"}
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db"},
        "spec": {
            "replicas": 2,
            "serviceName": "db",
            "selector": {"matchLabels": labels},
            "template": pod_template(labels, "gpu"),
        },
    }
    t.apps.create_namespaced_stateful_set(ns, sts)

    def both_running() -> list[Any]:
        ps = pods(t.core, ns)
        assert sorted(p.metadata.name for p in ps) == ["db-0", "db-1"]
        assert all(p.status.phase == "Running" for p in ps)
        return ps

    eventually(both_running)
    uid = t.core.read_namespaced_pod("db-0", ns).metadata.uid
    t.core.delete_namespaced_pod("db-0", ns)
    terminating = t.core.read_namespaced_pod("db-0", ns)
    assert terminating.metadata.deletion_timestamp is not None  # graceful: still there

    def recreated() -> bool:
        p = t.core.read_namespaced_pod("db-0", ns)
        assert p.metadata.uid != uid and p.status.phase == "Running"
        return True

    eventually(recreated)
    # The StatefulSet controller counts the new pod on a later pass, as on a real cluster:
    # status.readyReplicas trails the pod's own status.
    eventually(lambda: t.apps.read_namespaced_stateful_set("db", ns).status.ready_replicas == 2)


def test_deployment_event_shapes(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    t.apps.create_namespaced_deployment(ns, deployment("web", "gpu"))

    def events() -> dict[str, Any]:
        got = {e.reason: e for e in t.core.list_namespaced_event(ns).items}
        assert {"ScalingReplicaSet", "SuccessfulCreate", "Scheduled"} <= set(got)
        return got

    got = eventually(events)
    scaling = got["ScalingReplicaSet"]
    assert scaling.source.component == "deployment-controller"
    assert scaling.involved_object.kind == "Deployment"
    assert scaling.message.startswith("Scaled up replica set web-") and scaling.message.endswith(
        " from 0 to 1"
    )
    assert scaling.count == 1 and scaling.first_timestamp and scaling.event_time is None
    created = got["SuccessfulCreate"]
    assert created.source.component == "replicaset-controller"
    assert created.message.startswith("Created pod: web-")
    scheduled = got["Scheduled"]
    assert scheduled.reporting_component == "default-scheduler"
    assert scheduled.action == "Binding" and scheduled.event_time is not None
    assert scheduled.first_timestamp is None
    assert scheduled.message == (
        f"Successfully assigned {ns}/{scheduled.involved_object.name} to {NODE}"
    )
    deploy = t.apps.read_namespaced_deployment("web", ns)
    eventually(lambda: t.apps.read_namespaced_deployment("web", ns).status.available_replicas == 1)
    available = condition(t.apps.read_namespaced_deployment("web", ns), "Available")
    assert available.reason == "MinimumReplicasAvailable"
    assert deploy.metadata.annotations["deployment.kubernetes.io/revision"] == "1"


def test_deleted_job_takes_its_pods_along(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    job = _job("long", 0)
    job["spec"]["template"]["metadata"]["annotations"]["twin.sickbay.dev/run-seconds"] = "3600"
    t.batch.create_namespaced_job(ns, job)
    eventually(lambda: pods(t.core, ns) and pods(t.core, ns)[0].status.phase == "Running")
    t.batch.delete_namespaced_job("long", ns, propagation_policy="Background")
    # The pod's job-tracking finalizer is released, so it goes after its grace period.
    eventually(lambda: not pods(t.core, ns))
    eventually(lambda: not t.dra.list_namespaced_resource_claim(ns).items)


def test_job_on_failure_counts_restarts(twin: Any) -> None:
    t = twin()
    ns = t.namespace()
    t.dra.create_namespaced_resource_claim_template(ns, claim_template("gpu"))
    job = _job("retry-in-place", 1, backoff=2)
    job["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    t.batch.create_namespaced_job(ns, job)
    job_obj, cond = eventually(lambda: _job_condition(t, ns, "retry-in-place", "Failed"))
    assert cond.reason == "BackoffLimitExceeded"
    (pod,) = pods(t.core, ns)  # restarted in place, never replaced
    assert pod.status.container_statuses[0].restart_count >= 2
