"""A pod whose device health Sickbay cannot map is reported once per pod and id.

Cases: the watcher sees the same pod (an Unhealthy entry whose resourceID no ResourceSlice
publishes and whose claim does not exist) on every event of that pod; the WARNING that names
it is logged once, whichever logger would say it, while the sweep, which reads every pod once
per run, still warns on each run. A pod deleted (seen, or gone at a relist) and created again
under its name (a StatefulSet's pod) is a new pod: warned about again, and the watcher keeps
no marker for a pod that is gone.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from activities.sweep import SweepActivities
from contract.sweep import SweepReport
from worker.watcher import Tracker


class _NoClaims:
    """The one Kubernetes call the per-pod check makes here: reading the pod's claim by name."""

    def call(self, *_args: Any, **_kwargs: Any) -> dict[str, Any]:
        return {"items": []}

    class resource_v1:
        list_namespaced_resource_claim = None


def _pod(uid: str = "u1") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "serving", "name": "llm-0", "uid": uid},
        "spec": {"nodeName": "gpu-node-1"},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "main",
                    "allocatedResourcesStatus": [
                        {
                            "name": "claim:gpu",
                            "resources": [
                                {
                                    "resourceID": "k8s.gpu.nvidia.com/claim=gone-gpu-9",
                                    "health": "Unhealthy",
                                    "message": "XID 79",
                                }
                            ],
                        }
                    ],
                }
            ],
        },
    }


def test_watcher_warns_once_per_pod_and_id(caplog: pytest.LogCaptureFixture) -> None:
    finder = SweepActivities(_NoClaims())  # type: ignore[arg-type]
    tracker = Tracker(finder, emit=lambda _f: None, emit_node=lambda _f: None)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):  # five events of the same pod (status updates, a relist)
            tracker.pod(_pod())
    named = [r for r in caplog.records if "gone-gpu-9" in r.getMessage()]
    assert len(named) == 1, [f"{r.name}: {r.getMessage()}" for r in named]


def test_sweep_still_warns_on_every_run(caplog: pytest.LogCaptureFixture) -> None:
    finder = SweepActivities(_NoClaims())  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="activities.sweep"):
        for _ in range(2):
            report = SweepReport()
            finder.check_pods([_pod()], {}, {}, report)
            assert [u.resource_id for u in report.unresolved] == [
                "k8s.gpu.nvidia.com/claim=gone-gpu-9"
            ]
    assert len([r for r in caplog.records if "gone-gpu-9" in r.getMessage()]) == 2


@pytest.mark.parametrize("how", ["delete", "relist"])
def test_a_pod_gone_and_created_again_is_warned_about_again(
    caplog: pytest.LogCaptureFixture, how: str
) -> None:
    finder = SweepActivities(_NoClaims())  # type: ignore[arg-type]
    tracker = Tracker(finder, emit=lambda _f: None, emit_node=lambda _f: None)
    with caplog.at_level(logging.WARNING):
        tracker.pod(_pod("u1"))
        if how == "delete":
            tracker.pod(_pod("u1"), deleted=True)
        else:
            tracker.begin("pod")
            tracker.end("pod")
        assert tracker.unresolved == set()
        tracker.pod(_pod("u2"))  # the StatefulSet's new llm-0
    named = [r for r in caplog.records if "gone-gpu-9" in r.getMessage()]
    assert len(named) == 2, [r.getMessage() for r in named]
