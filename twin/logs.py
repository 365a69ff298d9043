"""`GET pods/<name>/log`: what the twin's fake containers print.

There is no process behind a twin container, so its log is made from what the kubelet
stand-in recorded in the pod status, one line per fact, in order: the start (image, node), the
health of each device the container holds (`allocatedResourcesStatus`: a dead GPU shows as
the CUDA error a real workload would print), and the exit (code, reason). `previous=true`
reads the last terminated instance. Query parameters honoured: `container`, `previous`,
`timestamps`, `tailLines`, `limitBytes`; `follow` returns what exists so far (the stream ends
at once). Errors are the kubelet's: no container chosen in a multi-container pod, an unknown
container, a container still waiting to start, no previous instance (400 BadRequest).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from twin import errors


def _lines(
    pod: dict[str, Any], cs: dict[str, Any], instance: dict[str, Any], output: list[str]
) -> list[tuple[str, str]]:
    name, node = cs.get("name", ""), (pod.get("spec") or {}).get("nodeName", "")
    out: list[tuple[str, str]] = []
    run = instance.get("running") or instance.get("terminated") or {}
    started = run.get("startedAt") or ""
    out.append(
        (started, f"sickbay-twin: container {name} started (image {cs.get('image', '')}) on {node}")
    )
    for entry in cs.get("allocatedResourcesStatus") or []:
        for res in entry.get("resources") or []:
            health = res.get("health", "Unknown")
            if health == "Healthy":
                out.append(
                    (started, f"sickbay-twin: {res.get('resourceID')} ready ({entry.get('name')})")
                )
            else:
                detail = f": {res['message']}" if res.get("message") else ""
                out.append(
                    (
                        started,
                        f"CUDA error: device {res.get('resourceID')} is {health}{detail} "
                        f"({entry.get('name')})",
                    )
                )
    out.extend((started, line) for line in output)  # what a tool container printed
    done = instance.get("terminated")
    if done:
        out.append(
            (
                done.get("finishedAt") or started,
                f"sickbay-twin: container {name} exited with code {done.get('exitCode', 0)}"
                f" ({done.get('reason') or 'Error'})",
            )
        )
    return out


def pod_log(
    pod: dict[str, Any],
    query: dict[str, str],
    now: datetime,
    output: Callable[[str, str], list[str]] | None = None,
) -> str:
    meta = pod["metadata"]
    containers = [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or []]
    wanted = query.get("container") or ""
    if not wanted:
        if len(containers) != 1:
            raise errors.bad_request(
                f"a container name must be specified for pod {meta['name']}, choose one of: "
                f"[{' '.join(containers)}]"
            )
        wanted = containers[0]
    if wanted not in containers:
        raise errors.bad_request(f"container {wanted} is not valid for pod {meta['name']}")
    statuses = {c.get("name"): c for c in (pod.get("status") or {}).get("containerStatuses") or []}
    cs = statuses.get(wanted)
    previous = query.get("previous") in ("true", "1")
    if previous:
        instance = ((cs or {}).get("lastState") or {}) if cs else {}
        if not instance.get("terminated"):
            raise errors.bad_request(
                f'previous terminated container "{wanted}" in pod "{meta["name"]}" not found'
            )
    else:
        instance = (cs or {}).get("state") or {}
        if not instance.get("running") and not instance.get("terminated"):
            if cs and instance.get("waiting") and (cs.get("lastState") or {}).get("terminated"):
                instance = cs["lastState"]  # crash-looping: the kubelet serves the last run
            else:
                reason = (instance.get("waiting") or {}).get("reason") or "ContainerCreating"
                raise errors.bad_request(
                    f'container "{wanted}" in pod "{meta["name"]}" is waiting to start: {reason}'
                )
    assert cs is not None
    printed = output(meta.get("uid", ""), wanted) if output and not previous else []
    lines = _lines(pod, cs, instance, printed)
    stamped = query.get("timestamps") in ("true", "1")
    text = [f"{when or now.isoformat()} {line}" if stamped else line for when, line in lines]
    if query.get("tailLines"):
        try:
            tail = int(query["tailLines"])
        except ValueError:
            raise errors.bad_request(f"invalid tailLines {query['tailLines']!r}") from None
        text = text[-tail:] if tail > 0 else []
    body = "".join(line + "\n" for line in text)
    if query.get("limitBytes"):
        try:
            body = body[: int(query["limitBytes"])]
        except ValueError:
            raise errors.bad_request(f"invalid limitBytes {query['limitBytes']!r}") from None
    return body
