"""The dev tools' commands a user types, as subprocesses (what `make demo` / `make up` run):

- `sickbay-dev demo --list` names every scenario; a bad --time-scale is refused by argparse;
- `sickbay-dev demo --scenario app-xid`: exit 0, progress lines with elapsed time, the incident's
  timeline, the summary and the wall time printed, and afterwards no process of the stack's
  process group is alive;
- `sickbay-dev demo --scenario app-xid --keep`: exit 0, prints how to stop; the stack still answers;
  `sickbay-dev down` stops every process of the group;
- `sickbay-dev up`: prints the Web UI / env / `sickbay-dev twin fail` help; `sickbay-dev twin fail` works
  against it from another process; Ctrl-C (SIGINT) stops all of it, exit 0;
- `sickbay-dev down` with nothing running says so and exits 1.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow(seconds=110), pytest.mark.devserver]

SICKBAY_DEV = [sys.executable, "-m", "harness.cli"]  # `sickbay-dev`, without a re-install
# A demo run on a loaded 2-core machine: stack start ~10 s + scenario; generous, never hit.
RUN_TIMEOUT = 150


def _env(tmp_path: Path) -> dict[str, str]:
    env = os.environ.copy()
    env["SICKBAY_STATE_DIR"] = str(tmp_path / "state")  # never the user's ~/.sickbay
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _pgid(output: str) -> int:
    match = re.search(r"process group (\d+)", output)
    assert match, output
    return int(match.group(1))


def test_list_and_bad_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.cli import main

    monkeypatch.setenv("SICKBAY_STATE_DIR", str(tmp_path))
    assert main(["demo", "--list"]) == 0
    listed = capsys.readouterr().out
    for name in (
        "seed",
        "training",
        "vgpu",
        "budget",
        "app-xid",
        "churn",
        "eks",
        "eks-repair",
        "upgrade",
    ):
        assert re.search(rf"^{name}\s", listed, re.M), listed
    with pytest.raises(SystemExit) as bad:
        main(["demo", "--time-scale", "0"])
    assert bad.value.code == 2 and "must be > 0" in capsys.readouterr().err
    assert main(["down"]) == 1
    assert "no running stack" in capsys.readouterr().out


def test_demo_runs_and_leaves_nothing(tmp_path: Path) -> None:
    out = subprocess.run(
        [*SICKBAY_DEV, "demo", "--scenario", "app-xid", "--time-scale", "60"],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=RUN_TIMEOUT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert re.search(r"^\[\s+\d+\.\ds\] stack\s+up in", text, re.M)
    assert "Timeline of sickbay-gpu-" in text
    assert "scenario app-xid: all" in text and "checks passed" in text
    assert re.search(r"wall time \d+\.\d s", text)
    assert "Demo runbooks" in text and "pendingDeadline 5m->8s" in text
    assert not _group_alive(_pgid(text))


@pytest.mark.parametrize("scenario", ["eks-repair", "eks"])
def test_the_eks_scenarios_scale_and_repair_through_boto3(tmp_path: Path, scenario: str) -> None:
    """`sickbay-dev demo --scenario eks[-repair]`: the worker's boto3 reaches the twin's EKS / EC2
    shapes (its AWS config and credentials file made by the stack), asks once."""
    out = subprocess.run(
        [*SICKBAY_DEV, "demo", "--scenario", scenario],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=RUN_TIMEOUT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert f"scenario {scenario}: all" in text and "checks passed" in text
    if scenario == "eks":
        assert "scale-up via the twin's EKS node group" in text
        assert "one EKS node-group update (UpdateNodegroupConfig" in text
    else:
        assert "one EC2 RebootInstances of node" in text
    assert not _group_alive(_pgid(text))


def test_demo_keep_then_down(tmp_path: Path) -> None:
    env = _env(tmp_path)
    out = subprocess.run(
        [*SICKBAY_DEV, "demo", "--scenario", "app-xid", "--keep", "--time-scale", "60"],
        capture_output=True,
        text=True,
        env=env,
        timeout=RUN_TIMEOUT,
    )
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        assert "sickbay-dev down" in out.stdout
        pgid = _pgid(out.stdout)
        assert _group_alive(pgid)
        gpus = subprocess.run(
            [*SICKBAY_DEV, "twin", "gpus"], capture_output=True, text=True, env=env, timeout=30
        )
        assert gpus.returncode == 0, gpus.stderr  # found through $SICKBAY_STATE_DIR
    finally:
        down = subprocess.run(
            [*SICKBAY_DEV, "down"], capture_output=True, text=True, env=env, timeout=60
        )
    assert down.returncode == 0, down.stdout
    assert not _group_alive(pgid)


def test_up_until_ctrl_c(tmp_path: Path) -> None:
    env = _env(tmp_path)
    proc = subprocess.Popen(
        [*SICKBAY_DEV, "up", "--time-scale", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C stops all of it" in line:
                break
        text = "".join(lines)
        assert "The stack is up" in text, text
        node = re.search(r"sickbay-dev twin fail (\S+) 0 --xid 79", text)
        assert node, text
        fail = subprocess.run(
            [*SICKBAY_DEV, "twin", "fail", node.group(1), "0", "--xid", "79"],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        assert fail.returncode == 0, fail.stdout + fail.stderr
        pgid = _pgid(text)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, rest
    assert "stopped: nothing left running" in rest
    assert not _group_alive(pgid)
