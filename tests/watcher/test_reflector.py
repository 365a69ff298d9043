"""The reflector's protocol decisions, against a scripted API (no server):

- a 410 answered as the watch request's HTTP status re-lists (client-go does the same);
- an expired `continue` token (410 on a LIST page) restarts the LIST from the first page,
  and the handler's replace only ends once a whole list arrived;
- a 403 on the watch is retried with backoff and logged as an error, never raised out of run();
- each event moves the resourceVersion on only after the handler has it.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import pytest

from activities.kube.client import ErrorKind, KubeError
from activities.kube.reflector import Reflector


class Resp:
    def __init__(self, status: int, lines: list[dict[str, Any]] | None = None, body: Any = None):
        self.status = status
        self._lines = lines or []
        self.data = json.dumps(body or {}).encode()

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        for event in self._lines:
            yield (json.dumps(event) + "\n").encode()

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class Script:
    """list pages and watch answers, in order; stops the reflector when it runs out."""

    def __init__(self, lists: list[Any], watches: list[Resp]) -> None:
        self.lists, self.watches = list(lists), list(watches)
        self.reflector: Reflector | None = None
        self.calls: list[str] = []

    def list_fn(self, **kwargs: Any) -> Any:
        if kwargs.get("watch"):
            self.calls.append(f"watch rv={kwargs['resource_version']}")
            if not self.watches:
                assert self.reflector is not None
                self.reflector.stop()
                return Resp(200)
            return self.watches.pop(0)
        self.calls.append(f"list continue={kwargs.get('_continue')}")
        page = self.lists.pop(0)
        if isinstance(page, KubeError):
            raise page
        return page


class FakeKube:
    timeout = 1.0

    def call(self, fn: Any, *args: Any, verb: str, resource: str, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


class Handler:
    def __init__(self) -> None:
        self.log: list[str] = []

    def begin_replace(self) -> None:
        self.log.append("begin")

    def upsert(self, obj: dict[str, Any]) -> None:
        self.log.append(f"upsert {obj['metadata']['name']}")

    def delete(self, obj: dict[str, Any]) -> None:
        self.log.append(f"delete {obj['metadata']['name']}")

    def end_replace(self) -> None:
        self.log.append("end")


def page(rv: str, names: list[str], token: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if token:
        meta["continue"] = token
    return {"items": [{"metadata": {"name": n}} for n in names], "metadata": meta}


def event(kind: str, name: str, rv: str) -> dict[str, Any]:
    return {"type": kind, "object": {"metadata": {"name": name, "resourceVersion": rv}}}


def run(script: Script, handler: Handler) -> Reflector:
    r = Reflector(
        FakeKube(),  # type: ignore[arg-type]
        script.list_fn,
        resource="pods",
        handler=handler,
        backoff_initial=0.01,
        backoff_max=0.02,
    )
    script.reflector = r
    t = threading.Thread(target=r.run)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive()
    return r


def test_http_410_on_watch_relists() -> None:
    script = Script(
        [page("10", ["a"]), page("20", ["a", "b"])],
        [Resp(200, [event("MODIFIED", "a", "11")]), Resp(410, body={"code": 410})],
    )
    handler = Handler()
    r = run(script, handler)
    assert script.calls == [
        "list continue=None",
        "watch rv=10",
        "watch rv=11",  # resumed from the event's resourceVersion
        "list continue=None",  # 410 -> relist
        "watch rv=20",
    ]
    assert handler.log == [
        "begin",
        "upsert a",
        "end",
        "upsert a",
        "begin",
        "upsert a",
        "upsert b",
        "end",
    ]
    assert r.stats.relists == 1 and r.stats.errors == 0


def test_expired_continue_restarts_the_list() -> None:
    gone = KubeError(ErrorKind.INVALID, status=410, verb="list", resource="pods")
    script = Script(
        [page("5", ["a"], token="t1"), gone, page("7", ["a"], token="t2"), page("7", ["b"])],
        [],
    )
    handler = Handler()
    run(script, handler)
    assert script.calls[:4] == [
        "list continue=None",
        "list continue=t1",
        "list continue=None",
        "list continue=t2",
    ]
    assert script.calls[4] == "watch rv=7"  # the first page's resourceVersion
    assert handler.log == ["begin", "upsert a", "begin", "upsert a", "upsert b", "end"]


def test_forbidden_watch_is_retried_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    forbidden = Resp(403, body={"message": 'pods is forbidden: User "x" cannot watch'})
    script = Script([page("3", [])], [forbidden, forbidden, Resp(200, [event("ADDED", "c", "4")])])
    handler = Handler()
    with caplog.at_level(logging.WARNING):
        r = run(script, handler)
    assert r.stats.errors == 2
    assert "upsert c" in handler.log
    errors = [rec for rec in caplog.records if rec.levelno == logging.ERROR]
    assert len(errors) == 2 and "forbidden" in errors[0].getMessage()
