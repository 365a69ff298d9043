"""`freeze_startup_heap`: the worker's and webhook's start-up objects leave the collector's scans.

Cases:
- objects alive at the call (here: a fresh batch of containers, which the collector tracks)
  are frozen: the permanent generation grows by at least that many, and a full collection
  afterwards no longer walks them (they are not in any generation's list);
- objects made after the call are tracked normally;
- `sickbay webhook` calls it after building the app, before serving (`sickbay worker`'s call
  is checked in its log by test_worker_process.py).
"""

from __future__ import annotations

import argparse
import gc

import pytest

from worker import webhook_cli
from worker.temporal import freeze_startup_heap


def test_freeze_moves_live_objects_out_of_the_scanned_generations() -> None:
    before = gc.get_freeze_count()
    survivors = [[i] for i in range(5_000)]
    try:
        frozen = freeze_startup_heap()
        assert frozen >= before + len(survivors)
        tracked = {id(o) for g in range(3) for o in gc.get_objects(generation=g)}
        assert not any(id(s) in tracked for s in survivors[:100])
        later = [0]
        assert id(later) in {id(o) for o in gc.get_objects(generation=0)}
    finally:
        gc.unfreeze()  # the rest of the test session keeps a normal heap


def test_webhook_freezes_before_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sickbay webhook`'s start-up (the app it serves included) is frozen when serving starts."""
    import uvicorn

    seen: dict[str, bool] = {}

    def serve(server: uvicorn.Server) -> None:  # stands in for uvicorn's blocking server
        tracked = {id(o) for g in range(3) for o in gc.get_objects(generation=g)}
        apps = (server.config.app, server.config.loaded_app)
        seen["app frozen"] = all(id(a) not in tracked for a in apps)
        seen["heap frozen"] = gc.get_freeze_count() > 0

    monkeypatch.setattr(uvicorn.Server, "run", serve)
    args = argparse.Namespace(host="127.0.0.1", port=0, no_auth=True, access_log=False)
    try:
        assert webhook_cli._run_webhook(args) == 0
    finally:
        gc.unfreeze()
    assert seen == {"app frozen": True, "heap frozen": True}
