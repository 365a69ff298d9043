"""The worker half of `workflows/identity.py`: hand each signal's and update's Temporal client
identity (recorded by the server in history) to the workflow, in the `SENDER_HEADER` header.

The SDK gives the identity to the worker in the activation (`SignalWorkflow.identity`,
`DoUpdate.meta.identity`) but not to workflow code; this runner copies it into the header the
workflow interceptor reads, overwriting any header of that name a client sent.

The SDK has no public way to this identity (not in `workflow.info()`, `current_update_info()`
or the interceptors' inputs), so the runner relies on the SDK's activation protobufs and on its
instance wrapping, which may change in any minor release: it supports the temporalio versions
`TEMPORALIO_SUPPORTED` names, and pyproject.toml pins those (docs/architecture.md, "The
Temporal SDK pin").
"""

from __future__ import annotations

import json
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner

from workflows.identity import SENDER_HEADER, UNKNOWN

TEMPORALIO_SUPPORTED = ">=1.35,<1.36"
"""The temporalio releases this runner is checked against; pyproject.toml requires exactly
these (tests/workflows/test_sdk_pin.py fails on another installed version or a drifted pin)."""


def _identity_payload(identity: str) -> Payload:
    return Payload(
        metadata={"encoding": b"json/plain"}, data=json.dumps(identity or UNKNOWN).encode()
    )


class _Instance(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance) -> None:
        self._inner = inner

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        for job in act.jobs:
            kind = job.WhichOneof("variant")
            if kind == "signal_workflow":
                job.signal_workflow.headers[SENDER_HEADER].CopyFrom(
                    _identity_payload(job.signal_workflow.identity)
                )
            elif kind == "do_update":
                job.do_update.headers[SENDER_HEADER].CopyFrom(
                    _identity_payload(job.do_update.meta.identity)
                )
        return self._inner.activate(act)

    def get_serialization_context(self, command_info: Any) -> Any:
        return self._inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self._inner.get_external_store_context(command_info)

    def get_info(self) -> Any:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()


class SenderIdentityRunner(WorkflowRunner):
    """`inner` with each signal's / update's client identity copied into the `SENDER_HEADER`
    header. Wrap both of a worker's runners (the remediation workflow is unsandboxed)."""

    def __init__(self, inner: WorkflowRunner) -> None:
        self._inner = inner

    def prepare_workflow(self, defn: Any) -> None:
        self._inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _Instance(self._inner.create_instance(det))

    def set_worker_level_failure_exception_types(self, types: Any) -> None:
        self._inner.set_worker_level_failure_exception_types(types)
