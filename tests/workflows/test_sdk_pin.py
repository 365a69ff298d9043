"""The temporalio pin that `worker.identity.SenderIdentityRunner` needs (docs/architecture.md,
"The Temporal SDK pin").

The runner reads the SDK's activation protobufs, not a public API, so it supports the releases
`TEMPORALIO_SUPPORTED` names and no others.

Cases:
- the installed temporalio is one of those releases;
- pyproject.toml requires exactly those releases (the constant and the pin do not drift apart);
- the activation fields the runner reads and writes still exist with the types it expects
  (a bump that renames or moves one fails here by name, before the dev-server tests).
"""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from temporalio.bridge.proto.workflow_activation import (
    DoUpdate,
    SignalWorkflow,
    WorkflowActivationJob,
)

from worker.identity import TEMPORALIO_SUPPORTED

ROOT = Path(__file__).resolve().parents[2]


def test_installed_temporalio_is_supported_by_the_identity_runner() -> None:
    installed = version("temporalio")
    assert SpecifierSet(TEMPORALIO_SUPPORTED).contains(installed, prereleases=True), (
        f"temporalio {installed} is installed; worker/identity.py supports "
        f"{TEMPORALIO_SUPPORTED}: check the runner against this release, then move the range "
        "(docs/architecture.md, 'The Temporal SDK pin')"
    )


def test_pyproject_pins_the_supported_range() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (temporalio,) = [
        Requirement(text)
        for text in pyproject["project"]["dependencies"]
        if Requirement(text).name == "temporalio"
    ]
    assert temporalio.specifier == SpecifierSet(TEMPORALIO_SUPPORTED), (
        f"pyproject.toml requires temporalio{temporalio.specifier}, "
        f"worker/identity.py supports {TEMPORALIO_SUPPORTED}"
    )


def _message(field: FieldDescriptor) -> Descriptor:
    assert field.message_type is not None, f"{field.full_name} is no longer a message"
    return field.message_type


def test_the_activation_fields_the_runner_uses_exist() -> None:
    job_variants = WorkflowActivationJob.DESCRIPTOR.oneofs_by_name["variant"].fields
    assert {"signal_workflow", "do_update"} <= {field.name for field in job_variants}

    signal = SignalWorkflow.DESCRIPTOR.fields_by_name
    assert signal["identity"].type == FieldDescriptor.TYPE_STRING
    assert _message(signal["headers"]).GetOptions().map_entry

    update = DoUpdate.DESCRIPTOR.fields_by_name
    assert _message(update["headers"]).GetOptions().map_entry
    meta = _message(update["meta"]).fields_by_name
    assert meta["identity"].type == FieldDescriptor.TYPE_STRING
