"""`sickbay gpus` and the ledger activities against a real Temporal dev server.

Cases:
- the ledger activities create the ledger by update-with-start (the dev server has it) and
  count failures per GPU: the third within the window retires it (one RMA incident), a
  repair of another GPU is recorded once per rung;
- `sickbay gpus` lists the retired GPU and the repaired one (table and `--json`, with counts
  and the retired GPU's history); a GPU with one failure and no repair is not listed;
- `sickbay gpus unretire` needs `--reason` (exit 2), records the actor and the Temporal client
  identity, refuses a GPU that is not retired (exit 1), and the GPU then leaves the list;
- with no ledger yet, `gpus` says so (exit 0) and `unretire` fails (exit 1).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta

import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.ledger import LedgerActivities
from contract.ledger import LedgerState, RecordFailureInput, RecordRepairInput
from contract.names import QRY_LEDGER_STATE, ledger_task_queue, ledger_workflow_id
from worker.cli import main as cli_main
from worker.main import sender_identity_options
from workflows.ledger import GpuLedgerWorkflow

pytestmark = pytest.mark.devserver


async def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(cli_main, list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out, out.err
    return code, out.out, out.err


def _failure(gpu: str, incident: str) -> RecordFailureInput:
    return RecordFailureInput(
        gpu_uuid=gpu,
        node="node-a",
        incident=incident,
        holder=f"sickbay-gpu-node-a-{incident}",
        failure_class="unhealthy",
        evidence="pod status reports the device Unhealthy",
        xid=95,
        failures=3,
        window=timedelta(days=7),
    )


async def test_gpus_list_and_unretire(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    client = dev_env.client
    queue = f"gpus-{uuid.uuid4().hex[:8]}"
    conn = ["--address", client.service_client.config.target_host, "--task-queue", queue]
    lemon, repaired, once = (f"GPU-{n}-{uuid.uuid4()}" for n in ("lemon", "fixed", "once"))

    code, out, _ = await _cli(capsys, "gpus", *conn)
    assert code == 0 and "no GPU ledger" in out
    code, _, err = await _cli(capsys, "gpus", "unretire", *conn, lemon, "--reason", "x")
    assert code == 1 and "no GPU ledger" in err

    acts = LedgerActivities(client, queue)
    assert acts.workflow_id == ledger_workflow_id(queue)
    worker = Worker(
        client,
        task_queue=ledger_task_queue(queue),
        workflows=[GpuLedgerWorkflow],
        **sender_identity_options(),
    )
    async with worker:
        decisions = [await acts.record_gpu_failure(_failure(lemon, f"i{i}")) for i in range(3)]
        await acts.record_gpu_failure(_failure(once, "o1"))
        await acts.record_gpu_failure(_failure(repaired, "r1"))
        for _ in range(2):  # a retried activity: recorded once
            await acts.record_gpu_repair(
                RecordRepairInput(
                    gpu_uuid=repaired, incident="r1", rung="reset", detail="validation passed"
                )
            )
        assert [d.failures_in_window for d in decisions] == [1, 2, 3]
        assert decisions[-1].retired and decisions[-1].rma_due
        assert not decisions[0].retired

        code, out, err = await _cli(capsys, "gpus", *conn, "--json")
        assert code == 0, err
        listed = {g["gpu_uuid"]: g for g in json.loads(out)["gpus"]}
        assert set(listed) == {lemon, repaired}
        assert listed[lemon]["retired"] and listed[lemon]["failures_in_window"] == 3
        assert [e["kind"] for e in listed[lemon]["history"]].count("failure") == 3
        assert listed[repaired]["repairs"] == 1 and not listed[repaired]["retired"]

        code, out, _ = await _cli(capsys, "gpus", *conn)
        assert code == 0
        header, *rows = out.splitlines()[:3]
        assert header.split()[:3] == ["GPU", "NODE", "STATE"]
        assert rows[0].split()[:3] == [lemon, "node-a", "retired"]  # retired first
        assert "failure Xid 95 (unhealthy)" in out  # the retired GPU's history

        with pytest.raises(SystemExit) as no_reason:
            cli_main(["gpus", "unretire", *conn, lemon])
        assert no_reason.value.code == 2
        capsys.readouterr()
        code, out, err = await _cli(
            capsys, "gpus", "unretire", *conn, lemon, "--reason", "vendor RMA'd", "--actor", "ann"
        )
        assert code == 0 and "un-retired by ann (unverified" in out, err
        assert "sickbay-gpu-node-a-i2 told" in out
        code, _, err = await _cli(capsys, "gpus", "unretire", *conn, lemon, "--reason", "again")
        assert code == 1 and "is not retired" in err

        state = await client.get_workflow_handle(acts.workflow_id).query(
            QRY_LEDGER_STATE, result_type=LedgerState
        )
        [entry] = [e for g in state.gpus for e in g.entries if e.kind == "unretired"]
        assert entry.actor == "ann" and entry.detail == "vendor RMA'd"
        assert entry.client_identity  # the CLI's Temporal client identity, seen by the server
        code, out, _ = await _cli(capsys, "gpus", *conn, "--json")
        assert {g["gpu_uuid"] for g in json.loads(out)["gpus"]} == {repaired}
        await client.get_workflow_handle(acts.workflow_id).terminate("test done")
