"""`sickbay launch --node N --gpu I` resolves the GPU index on the cluster twin, with product code
only.

The CLI runs the resolve-device activity's code as a plain call: it needs no test-only part of
the Temporal SDK (`temporalio.testing` is made unimportable in the process that resolves).

Cases:
- node + index 1 resolves to the UUID the twin's ResourceSlice lists for gpu-1 of that node;
- an index the node does not have is a clear "not found" error, not a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from twin.testing import RunningTwin

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import asyncio, json, sys
sys.modules["temporalio.testing"] = None  # product code must not need it
from worker.commands import _resolve
from worker.settings import Settings
from contract.kube import DeviceRef
try:
    ref = asyncio.run(_resolve(Settings(), DeviceRef(node=sys.argv[1], gpu_index=int(sys.argv[2]))))
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
else:
    print(json.dumps({"node": ref.node, "gpu_uuid": ref.gpu_uuid}))
"""


def _resolve(twin: RunningTwin, node: str, index: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SICKBAY_")}
    env["KUBECONFIG"] = str(twin.kubeconfig_path)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, node, str(index)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _node_and_uuid(twin: RunningTwin, device: str) -> tuple[str, str]:
    rs = twin.store.list("resourceslices.resource.k8s.io").items[0]
    dev = next(d for d in rs["spec"]["devices"] if d["name"] == device)
    return rs["spec"]["nodeName"], dev["attributes"]["uuid"]["string"]


def test_node_and_index_resolve_to_the_twins_uuid(twin: RunningTwin) -> None:
    node, uuid = _node_and_uuid(twin, "gpu-1")
    assert _resolve(twin, node, 1) == {"node": node, "gpu_uuid": uuid}


def test_an_index_the_node_lacks_is_not_found(twin: RunningTwin) -> None:
    node, _ = _node_and_uuid(twin, "gpu-0")
    got = _resolve(twin, node, 7)
    assert got["error"] == "ApplicationError" and "7" in got["message"], got
