"""A node whose GPUs vanish after an upgrade: vanish -> diagnosis, vanish -> GPUs back.

An embedded stack with the health watcher on (no alert, no sweep) runs a pool of 3 GPU nodes
(DRA, 2 GPUs each) with the NVIDIA plugin pods of twin/upgrade.py. Each round upgrades one
node's kubelet twice:

- `socket` (the DRA kubelet plugin stays Ready but unregistered: its ResourceSlice empties):
  timed from the upgrade to the node incident's diagnosis (its status query names the cause),
  to the GPUs published again (after the second look `nodeIncident.settle` waits for, since
  the plugin is Ready: 30 s shipped, 1 s in the x30 demo runbooks; then the one plugin
  restart) and to the incident closed `healed` (each GPU validated, the node released);
- `hook` (the container toolkit hook fails: a restart cannot fix it): timed from the upgrade
  to the diagnosis and to the page (no restart first); then the fix is rolled out (the twin's
  `recover`) and the node released.

Wall-clock seconds, the twin `time_scale` times faster; the incident's polls run every 2 s of
real time (workflows/node_incident/calls.py POLL_RETRY), which dominates "GPUs back".
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from bench.common import summary
from bench.stacks import open_stack
from contract.names import QRY_NODE_STATUS, QRY_TIMELINE, node_workflow_id
from contract.node_incident import NodeIncidentResult, NodeIncidentStatus
from harness.scenarios import Demo, Progress

log = logging.getLogger("bench.node_upgrade")

POLL = 0.05  # real seconds between looks
WITHIN = 180.0  # real seconds: a stage not reached by then is a failed run


async def _until(what: str, probe: Any) -> Any:
    deadline = time.monotonic() + WITHIN
    while True:
        try:
            got = await probe()
        except Exception:  # the workflow not started yet, a query racing its start
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise RuntimeError(f"not reached within {WITHIN:.0f} s: {what}")
        await asyncio.sleep(POLL)


async def _published(demo: Demo, node: str) -> int:
    slices = (await demo.k("GET", "/apis/resource.k8s.io/v1/resourceslices"))["items"]
    return sum(
        len(s["spec"].get("devices") or []) for s in slices if s["spec"].get("nodeName") == node
    )


async def _diagnosed(demo: Demo, wid: str, run_id: str | None) -> NodeIncidentStatus | None:
    handle = demo.client.get_workflow_handle(wid)
    desc = await handle.describe()
    if run_id is not None and desc.run_id == run_id:
        return None  # the previous round's run
    st: NodeIncidentStatus = await handle.query(QRY_NODE_STATUS, result_type=NodeIncidentStatus)
    return st if st.summary else None


async def _last_run(demo: Demo, wid: str) -> str | None:
    try:
        return (await demo.client.get_workflow_handle(wid).describe()).run_id
    except Exception:
        return None


async def _evidence(demo: Demo, node: str) -> str:
    """What a failed round leaves to read: the incident's timeline, the twin's upgrade faults,
    the node's GPU plugin pods and its published devices."""
    parts: list[str] = []
    wid = node_workflow_id(node)
    try:
        lines = await demo.client.get_workflow_handle(wid).query(QRY_TIMELINE)
        parts.append("timeline:\n  " + "\n  ".join(lines))
    except Exception as err:  # the evidence of a failure must not hide it
        parts.append(f"timeline: {err!r}")
    try:
        parts.append(f"twin upgrades: {await demo.k('GET', '/twin/upgrades')}")
        pods = await demo.k("GET", "/api/v1/namespaces/gpu-operator/pods")
        for p in pods["items"]:
            if p["spec"].get("nodeName") == node:
                m, st = p["metadata"], p.get("status") or {}
                cs = (st.get("containerStatuses") or [{}])[0]
                parts.append(
                    f"pod {m['name']} deleting={bool(m.get('deletionTimestamp'))} "
                    f"phase={st.get('phase')} ready={cs.get('ready')} state={cs.get('state')}"
                )
        parts.append(f"published on {node}: {await _published(demo, node)}")
    except Exception as err:
        parts.append(f"twin: {err!r}")
    return "\n".join(parts)


async def _round(
    demo: Demo, node: str, version: str, breaks: str, out: dict[str, list[float]]
) -> None:
    try:
        await _round_of(demo, node, version, breaks, out)
    except Exception as err:
        raise RuntimeError(
            f"{breaks} round on {node}: {err}\n{await _evidence(demo, node)}"
        ) from err


async def _round_of(
    demo: Demo, node: str, version: str, breaks: str, out: dict[str, list[float]]
) -> None:
    wid = node_workflow_id(node)
    before = await _last_run(demo, wid)
    since = len(await demo.notifications())
    t0 = time.monotonic()
    await demo.k("POST", "/twin/upgrades", {"node": node, "kubelet": version, "breaks": breaks})
    st = await _until("diagnosis", lambda: _diagnosed(demo, wid, before))
    out[f"{breaks}: vanish -> diagnosis"].append(time.monotonic() - t0)
    log.info("%s: %s", node, st.summary)
    if breaks == "hook":

        async def paged() -> bool:
            return any(
                n["kind"] == "pagerduty" and n["body"].get("dedup_key", "").startswith(wid[:60])
                for n in await demo.notifications(since)
            )

        await _until("page", paged)
        out["hook: vanish -> page"].append(time.monotonic() - t0)
        await demo.k("POST", "/twin/upgrades/recover", {"node": node})
    else:

        async def back() -> bool:
            return await _published(demo, node) >= 2

        await _until("GPUs back", back)
        out["socket: vanish -> GPUs back"].append(time.monotonic() - t0)
    handle = demo.client.get_workflow_handle(wid, result_type=NodeIncidentResult)
    result = await asyncio.wait_for(handle.result(), timeout=WITHIN)
    if result.outcome != "healed":
        raise RuntimeError(f"{wid} closed {result.outcome}: {result.summary}")
    if breaks == "socket":
        out["socket: vanish -> validated, released"].append(time.monotonic() - t0)


async def run(rounds: int = 10, time_scale: float = 30.0) -> dict[str, Any]:
    stack = open_stack(time_scale=time_scale, watch=True, nodes=3, pool_max=3)
    timings: dict[str, list[float]] = {
        "socket: vanish -> diagnosis": [],
        "socket: vanish -> GPUs back": [],
        "socket: vanish -> validated, released": [],
        "hook: vanish -> diagnosis": [],
        "hook: vanish -> page": [],
    }
    try:
        demo = await Demo.open(stack, Progress(lambda line: log.info("%s", line)))
        try:
            await demo.k("POST", "/twin/gpu-plugins")
            nodes = sorted(await demo.nodes())

            async def ready() -> bool:
                return all([await _published(demo, n) >= 2 for n in nodes])

            await _until("plugins up", ready)
            for i in range(rounds):
                node = nodes[i % len(nodes)]
                await _round(demo, node, f"v1.36.{2 * i + 1}", "socket", timings)
                await _round(demo, node, f"v1.36.{2 * i + 2}", "hook", timings)
        finally:
            await demo.close()
    finally:
        stack.stop()
    return {
        "rounds": rounds,
        "time_scale": time_scale,
        "seconds": {k: summary(v) for k, v in timings.items()},
    }


def _s(v: float) -> str:
    return f"{v:.1f} s"


def summary_rows(r: dict[str, Any]) -> list[str]:
    rows = []
    for what in ("socket: vanish -> diagnosis", "socket: vanish -> GPUs back"):
        s = r["seconds"].get(what) or {}
        if s.get("n"):
            rows.append(
                f"| node upgrade, {what} (p50 / p99, {s['n']} runs, twin "
                f"x{r['time_scale']:g}) | {_s(s['p50'])} / {_s(s['p99'])} | | |"
            )
    return rows


def section(r: dict[str, Any]) -> list[str]:
    out = [
        "## Node upgrade: GPUs that vanish",
        "",
        f"`bench/node_upgrade.py`: {r['rounds']} rounds on a 3-node x 2-GPU DRA twin "
        f"(x{r['time_scale']:g}, health watcher on, no alert, no sweep). Each round upgrades one "
        "node's kubelet so its DRA plugin loses its registration (`socket`: the plugin is "
        "Ready, so the incident looks again after `nodeIncident.settle`, 30 s shipped and 1 s "
        "in these x30 runbooks, as a routine kubelet restart looks the same for seconds; then "
        "one plugin restart heals it, each GPU validated before the node is released), then "
        "so the container "
        "toolkit hook fails (`hook`: a restart cannot fix it, paged at once; then the fix "
        "rolled out). From the upgrade to each stage, in wall-clock seconds.",
        "",
        "| stage | n | p50 | p99 | max |",
        "|---|---|---|---|---|",
    ]
    for what, s in r["seconds"].items():
        if s.get("n"):
            out.append(f"| {what} | {s['n']} | {_s(s['p50'])} | {_s(s['p99'])} | {_s(s['max'])} |")
    out.append("")
    return out
