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

import gc
import inspect

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


def test_webhook_freezes_before_serving() -> None:
    webhook_src = inspect.getsource(webhook_cli._run_webhook)
    assert webhook_src.index("freeze_startup_heap()") < webhook_src.index("uvicorn.run(")
