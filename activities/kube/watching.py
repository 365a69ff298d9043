"""List-then-watch on a worker thread, consumed on the event loop with regular heartbeats.

`watch_until()` lists once, hands the items to `on_list`, then watches from the list's
resourceVersion with `kubernetes.watch.Watch` (raw dicts, no model deserialisation). The
watch runs on the activities' executor; events reach the coroutine through an asyncio.Queue,
so the coroutine can heartbeat every `heartbeat_every` seconds even when nothing happens.
No polling: between events nothing is sent to the API server. A watch window ends after
`WATCH_WINDOW_SECONDS` (server-side timeout) and is resumed from the last resourceVersion;
410 Gone (resourceVersion too old) re-lists.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from kubernetes import watch as k8s_watch

from activities.kube.client import ErrorKind, Kube, KubeError, classify

# A watch is re-opened this often (seconds): long enough to be one request for a typical
# remediation, short enough that a dead connection is noticed without an idle read timeout.
WATCH_WINDOW_SECONDS = 300
_END = object()


async def _off_loop(
    loop: asyncio.AbstractEventLoop, executor: Executor, fn: Callable[..., bool], *args: Any
) -> bool:
    """Callbacks may read the API (claims), so they run on the executor, never the loop."""
    ctx = contextvars.copy_context()
    return await loop.run_in_executor(executor, lambda: ctx.run(fn, *args))


def _rv(obj: dict[str, Any]) -> str | None:
    return (obj.get("metadata") or {}).get("resourceVersion")


async def watch_until(
    kube: Kube,
    executor: Executor,
    list_fn: Callable[..., Any],
    list_args: tuple[Any, ...],
    list_kwargs: dict[str, Any],
    *,
    resource: str,
    on_list: Callable[[list[dict[str, Any]]], bool],
    on_event: Callable[[str, dict[str, Any]], bool],
    deadline: float = math.inf,
    heartbeat: Callable[[], None],
    heartbeat_every: float,
) -> bool:
    """True once `on_list`/`on_event` says done; False when the wall-clock `deadline` passes
    (none by default: watch until done or cancelled).

    `on_list`/`on_event` run on the executor (they may make blocking reads); `heartbeat`
    runs on the loop after each of them and every `heartbeat_every` seconds of quiet."""
    loop = asyncio.get_running_loop()
    while True:
        body = await loop.run_in_executor(
            executor,
            lambda: kube.call(list_fn, *list_args, verb="list", resource=resource, **list_kwargs),
        )
        done = await _off_loop(loop, executor, on_list, body.get("items") or [])
        heartbeat()
        if done:
            return True
        rv = _rv(body) or ""
        relist = False
        failures = 0  # consecutive broken watches; the second one fails the attempt
        while not relist:
            remaining = deadline - time.time()
            if remaining <= 0:
                return False
            window = int(max(1, min(WATCH_WINDOW_SECONDS, remaining + 1)))
            queue: asyncio.Queue[Any] = asyncio.Queue()
            watcher = k8s_watch.Watch(return_type="object")

            def produce(
                rv: str = rv, window: int = window, watcher: Any = watcher, queue: Any = queue
            ) -> None:
                try:
                    for event in watcher.stream(
                        list_fn,
                        *list_args,
                        resource_version=rv,
                        timeout_seconds=window,
                        allow_watch_bookmarks=True,
                        _request_timeout=(kube.timeout, window + kube.timeout),
                        **list_kwargs,
                    ):
                        loop.call_soon_threadsafe(queue.put_nowait, event)
                    loop.call_soon_threadsafe(queue.put_nowait, _END)
                except Exception as exc:  # handed to the coroutine, classified there
                    loop.call_soon_threadsafe(queue.put_nowait, exc)

            producer = loop.run_in_executor(executor, produce)
            try:
                while True:
                    timeout = min(heartbeat_every, max(0.0, deadline - time.time()))
                    try:
                        item = await asyncio.wait_for(queue.get(), timeout=timeout)
                    except TimeoutError:
                        heartbeat()
                        if time.time() >= deadline:
                            return False
                        continue
                    if item is _END:
                        break  # window over: resume from rv
                    if isinstance(item, BaseException):
                        err = classify(item, verb="watch", resource=resource)
                        if err.status == 410:
                            relist = True
                            break
                        failures += 1
                        if err.kind is ErrorKind.TRANSIENT and failures < 2:
                            break  # reconnect once from the last resourceVersion
                        # Let Temporal retry with backoff; heartbeat details keep progress.
                        raise err
                    obj = item.get("raw_object") or item.get("object") or {}
                    kind = item.get("type")
                    if kind == "ERROR":
                        code = obj.get("code") if isinstance(obj, dict) else None
                        if code == 410:
                            relist = True
                            break
                        raise KubeError(
                            ErrorKind.TRANSIENT,
                            status=code,
                            verb="watch",
                            resource=resource,
                            message=str(obj.get("message", "")) if isinstance(obj, dict) else "",
                        )
                    rv = _rv(obj) or rv
                    failures = 0
                    if kind == "BOOKMARK":
                        continue
                    done = await _off_loop(loop, executor, on_event, str(kind), obj)
                    heartbeat()
                    if done:
                        return True
            finally:
                watcher.stop()
                producer.add_done_callback(lambda f: f.exception())  # never "never retrieved"
