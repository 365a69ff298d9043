"""Who sent a signal or update: the Temporal client identity, beside the actor it claims.

An `actor` in `AbortRequest`, `RepairedRequest` or `ApprovalDecision` is whatever the caller
typed (`sickbay abort --actor ceo@example.com`). The Temporal server records, with every signal
and update, the `identity` of the client that sent it (the SDK sets it, by default
`<pid>@<host>`; the Web UI sends its own), and hands it to the worker in the activation. The SDK does not pass it on to workflow code, so:

- `worker.identity.SenderIdentityRunner` wraps the worker's workflow runners and copies each signal's
  `identity` and each update's `meta.identity` into the header `SENDER_HEADER` before the
  activation reaches the workflow, overwriting any header a client sent under that name;
- `SenderIdentityInterceptor` (inside the sandbox) reads that header while a signal or update
  handler runs, and `sender_identity()` returns it to the handler.

Both come from history, so a replay sees the same identities. Without them (a worker or
replayer built without), `sender_identity()` is None and the timeline says so. Neither is
authentication: Temporal's identity is also set by the client. Only the namespace's
authorizer decides who may send at all (docs/deploy.md, "Who can act").

This module is passed through the sandbox, so the context variable is one object for the
interceptor and the workflow.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from typing import Any

from temporalio.worker import (
    ExecuteWorkflowInput,
    HandleSignalInput,
    HandleUpdateInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

SENDER_HEADER = "sickbay-sender-identity"
UNKNOWN = "unknown"

_sender: ContextVar[str | None] = ContextVar("sickbay_sender_identity", default=None)


def claimed_by(actor: str, identity: str | None) -> str:
    """`ceo@example.com (claimed; Temporal client 4242@host)`: which part is only a claim and
    which one the server recorded."""
    return f"{actor} (claimed; Temporal client {identity or UNKNOWN})"


def sender_identity() -> str | None:
    """The Temporal client identity of the signal/update being handled (None: not known)."""
    return _sender.get()


def _read(headers: Any) -> str | None:
    payload = headers.get(SENDER_HEADER) if headers is not None else None
    if payload is None:
        return None
    try:
        value = json.loads(payload.data)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


class _Inbound(WorkflowInboundInterceptor):
    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        return await self.next.execute_workflow(input)

    async def handle_signal(self, input: HandleSignalInput) -> None:
        token = _sender.set(_read(input.headers))
        try:
            await self.next.handle_signal(input)
        finally:
            _sender.reset(token)

    def handle_update_validator(self, input: HandleUpdateInput) -> None:
        token = _sender.set(_read(input.headers))
        try:
            self.next.handle_update_validator(input)
        finally:
            _sender.reset(token)

    async def handle_update_handler(self, input: HandleUpdateInput) -> Any:
        token = _sender.set(_read(input.headers))
        try:
            return await self.next.handle_update_handler(input)
        finally:
            _sender.reset(token)


class SenderIdentityInterceptor(Interceptor):
    """Makes `sender_identity()` answer inside signal and update handlers."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return _Inbound
