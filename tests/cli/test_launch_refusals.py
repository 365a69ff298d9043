"""Typos never start anything: `sickbay launch` refuses, before it connects to Temporal, a
device the cluster twin does not confirm and every malformed selector.

Cases (exit 2, a message naming the problem, nothing started: no Temporal address answers):
- `--node N --uuid <a UUID that node has not got>` (another node's GPU, or made up);
- `--gpu 1 --uuid <GPU 0's UUID>`: two selectors naming different GPUs;
- `--uuid not-a-uuid`; `--select-attr a==b`; `--runbook nosuch` (no fallback to matching).
And the same node + UUID that the node has is accepted up to the Temporal connection.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.cli.test_launch_resolve import _node_and_uuid
from twin.testing import RunningTwin
from worker.cli import main as cli_main

# Nothing listens here: a launch that got past its checks fails to connect (exit 1), never 0.
NOWHERE = ["--address", "127.0.0.1:9", "--cluster", ""]


async def _launch(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = await asyncio.to_thread(cli_main, ["launch", *NOWHERE, *argv])
    except SystemExit as exc:  # argparse refusals
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


@pytest.fixture
def on_twin(twin: RunningTwin, monkeypatch: pytest.MonkeyPatch) -> RunningTwin:
    for name in ("SICKBAY_TEMPORAL_ADDRESS", "SICKBAY_CLUSTER", "SICKBAY_RUNBOOKS_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(twin.kubeconfig_path))
    return twin


async def test_a_uuid_the_node_has_not_got_is_refused(
    on_twin: RunningTwin, capsys: pytest.CaptureFixture[str]
) -> None:
    node, _ = _node_and_uuid(on_twin, "gpu-0")
    made_up = f"GPU-{uuid.uuid4()}"
    code, err = await _launch(capsys, "--node", node, "--uuid", made_up)
    assert code == 2 and "no such device, nothing launched" in err and made_up in err, err


async def test_conflicting_gpu_and_uuid_are_refused(
    on_twin: RunningTwin, capsys: pytest.CaptureFixture[str]
) -> None:
    node, uuid0 = _node_and_uuid(on_twin, "gpu-0")
    code, err = await _launch(capsys, "--node", node, "--gpu", "1", "--uuid", uuid0)
    assert code == 2 and "name different GPUs" in err and "is GPU 0" in err, err
    # The same device named right gets past every check (then fails to reach Temporal).
    code, err = await _launch(capsys, "--node", node, "--gpu", "0", "--uuid", uuid0)
    assert code == 1 and "cannot reach Temporal" in err, err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--node", "n1", "--uuid", "not-a-uuid"], "is not a GPU UUID"),
        (["--select-node", "n1", "--select-attr", "a==b"], "one '='"),
        (["--select-node", "n1", "--select-attr", "a="], "both sides non-empty"),
    ],
    ids=["uuid", "attr-double-equals", "attr-empty"],
)
async def test_malformed_arguments_are_refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    code, err = await _launch(capsys, *argv)
    assert code == 2 and says in err, err


async def test_an_unknown_runbook_is_refused(
    on_twin: RunningTwin, capsys: pytest.CaptureFixture[str]
) -> None:
    node, uuid0 = _node_and_uuid(on_twin, "gpu-0")
    code, err = await _launch(capsys, "--node", node, "--uuid", uuid0, "--runbook", "nosuch")
    assert code == 2 and "--runbook nosuch: no such runbook" in err and "default" in err, err
    code, err = await _launch(capsys, "--select-node", node, "--runbook", "nosuch")
    assert code == 2 and "no such runbook" in err, err
