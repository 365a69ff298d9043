"""The data converter converts the runbook set once per distinct set (worker/converter.py).

The shared set must be what the SDK's own pydantic converter writes and reads, byte for byte,
and never changeable, since the workflows that read the same bytes share one decoded value.
"""

from __future__ import annotations

import shutil
import typing
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.runbooks import RunbookActivities, load_dir
from contract.runbook import LOAD_RUNBOOKS, RunbookMatch, RunbookSet
from tests.workflows.fakes import RUNBOOKS_DIR
from worker.converter import DATA_CONVERTER, DECODED, ENCODED, KEEP

ours = DATA_CONVERTER.payload_converter
theirs = pydantic_data_converter.payload_converter


def test_the_shared_set_is_the_sdk_converters_bytes_and_value() -> None:
    runbooks = load_dir(RUNBOOKS_DIR)
    ENCODED.clear()
    DECODED.clear()
    first, again = ours.to_payloads([runbooks]), ours.to_payloads([runbooks])
    assert first == again == theirs.to_payloads([runbooks])
    assert (ENCODED.misses, ENCODED.hits) == (1, 1)  # encoded once
    read = ours.from_payloads(first, [RunbookSet])[0]
    assert read == theirs.from_payloads(first, [RunbookSet])[0] == runbooks
    assert ours.from_payloads(again, [RunbookSet])[0] is read  # validated once
    assert (DECODED.misses, DECODED.hits) == (1, 1)


def test_an_edited_set_is_its_own_value(tmp_path: Path) -> None:
    folder = Path(shutil.copytree(RUNBOOKS_DIR, tmp_path / "runbooks"))
    before = load_dir(folder)
    inference = folder / "inference.yaml"
    inference.write_text(inference.read_text().replace("severity: critical", "severity: warning"))
    after = load_dir(folder)
    assert after != before
    a, b = ours.to_payloads([before]), ours.to_payloads([after])
    assert a != b
    assert b == theirs.to_payloads([after])
    assert ours.from_payloads(a, [RunbookSet])[0] == before
    assert ours.from_payloads(b, [RunbookSet])[0] == after


def test_it_keeps_a_few_sets_and_other_values_go_through() -> None:
    DECODED.clear()
    sets = [RunbookSet(runbooks=(), source=f"dir{i}") for i in range(KEEP + 2)]
    read = [ours.from_payloads(ours.to_payloads([s]), [RunbookSet])[0] for s in sets]
    assert read == sets
    assert len(DECODED._items) == KEEP
    selector = RunbookMatch(namespaces=("a",))
    payload = ours.to_payloads([selector])
    once, twice = (ours.from_payloads(payload, [RunbookMatch])[0] for _ in range(2))
    assert once == twice == selector and once is not twice  # not a shared type: a new value


def _mutable_fields(model: type[BaseModel], seen: set[type]) -> list[str]:
    """Every field under `model` whose value could change in place: a list, a set, a dict
    (or a model that is not frozen)."""
    if model in seen:
        return []
    seen.add(model)
    out = [] if model.model_config.get("frozen") else [f"{model.__name__} is not frozen"]
    for name, field in model.model_fields.items():
        for t in _types(field.annotation):
            origin = typing.get_origin(t) or t
            if origin in (list, set, dict):
                out.append(f"{model.__name__}.{name}: {origin.__name__}")
            elif isinstance(t, type) and issubclass(t, BaseModel):
                out += _mutable_fields(t, seen)
    return out


def _types(annotation: Any) -> list[Any]:
    """The annotation and every type inside it (unions, tuples, Annotated)."""
    out = [annotation]
    for arg in typing.get_args(annotation):  # X | Y included
        if arg is not Ellipsis and not isinstance(arg, str | int):
            out += _types(arg)
    return out


def test_a_shared_set_cannot_change() -> None:
    found = _mutable_fields(RunbookSet, set())
    # The selector's label maps are the only containers left mutable: selector matching reads
    # them, nothing writes them (a dict has no frozen form in pydantic's JSON schema).
    assert sorted(found) == [
        "RunbookMatch.namespace_labels: dict",
        "RunbookMatch.pod_labels: dict",
    ]


@workflow.defn(name="converter-probe", sandboxed=False)
class _Probe:
    @workflow.run
    async def run(self) -> int:
        runbooks = await workflow.execute_local_activity(
            LOAD_RUNBOOKS.name,
            result_type=RunbookSet,
            start_to_close_timeout=timedelta(seconds=10),
        )
        assert isinstance(runbooks, RunbookSet)
        return id(runbooks)


async def test_remediations_on_one_worker_share_one_decoded_set(dev_client: Client) -> None:
    queue = f"tq-converter-{uuid.uuid4().hex[:8]}"
    loader = RunbookActivities(RUNBOOKS_DIR)
    async with Worker(
        dev_client,
        task_queue=queue,
        workflows=[_Probe],
        activities=[loader.load_runbooks],
        workflow_runner=UnsandboxedWorkflowRunner(),
        activity_executor=ThreadPoolExecutor(max_workers=2),
    ):
        ids = [
            await dev_client.execute_workflow(_Probe.run, id=f"probe-{queue}-{i}", task_queue=queue)
            for i in range(2)
        ]
    assert ids[0] == ids[1], "the second workflow decoded the set again"
    history = await dev_client.get_workflow_handle(f"probe-{queue}-1").fetch_history()
    markers = [
        e.marker_recorded_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    ]
    assert len(markers) == 1
    recorded = markers[0].details["result"].payloads[0]
    assert recorded.data == theirs.to_payloads([loader.current()])[0].data
