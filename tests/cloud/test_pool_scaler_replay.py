"""Replay of recorded pool-scaler histories (tests/cloud/histories/*.json, recorded with
record_histories.py on the dev server): the current PoolScalerWorkflow must make the same
commands, so a change that would break running scalers fails here first.

Recorded scenarios:
- coalesce_then_headroom: three concurrent needs (step 2) -> one resize, a later need served
  from the spare node, idle completion;
- quota_refused: two needs -> provider 403 -> both rejected; a later need gets the held
  refusal without a request;
- at_max_cap: pool at 3 of max 4, two needs -> one node, one at-max.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from worker.converter import DATA_CONVERTER
from workflows.pool_scaler import PoolScalerWorkflow

HISTORIES = Path(__file__).resolve().parent / "histories"


RECORDED = {p.stem: p.read_text() for p in sorted(HISTORIES.glob("*.json"))}


@pytest.mark.parametrize("name", sorted(RECORDED))
async def test_replay(name: str) -> None:
    replayer = Replayer(workflows=[PoolScalerWorkflow], data_converter=DATA_CONVERTER)
    await replayer.replay_workflow(WorkflowHistory.from_json(name, RECORDED[name]))


def test_histories_are_present() -> None:
    assert len(RECORDED) == 3
