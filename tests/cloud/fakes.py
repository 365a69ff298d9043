"""An in-memory `NodePoolClient` for pool-scaler logic tests (the real HTTP providers are
tested against respx and the twin)."""

from __future__ import annotations

from dataclasses import dataclass, field

from activities.cloud.base import CloudRejected, CloudUnavailable, ScaleOutcome
from contract.capacity import NodePoolTarget, PoolDescription, PoolOperation


@dataclass
class FakeNodePool:
    size: int = 2
    provider_max: int | None = None
    polls_until_done: int = 1  # looks at an operation before it reports done
    reject: str | None = None  # set_size raises CloudRejected with this message
    unavailable: int = 0  # the next N describe calls raise CloudUnavailable
    op_error: str | None = None  # operations finish with this error
    pending: PoolOperation | None = None  # a foreign resize running on the pool
    pending_target: int | None = None
    set_size_calls: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    _ops: dict[str, list[int]] = field(default_factory=dict)  # id -> [polls left, target]

    async def describe(self, pool: NodePoolTarget) -> PoolDescription:
        if self.unavailable:
            self.unavailable -= 1
            raise CloudUnavailable("HTTP 503: backend unavailable")
        return PoolDescription(
            current_size=self.size, max_size=self.provider_max, pending_operation=self.pending
        )

    async def set_size(
        self, pool: NodePoolTarget, size: int, max_size: int, idempotency_key: str
    ) -> ScaleOutcome:
        assert size <= max_size, f"asked {size} above max {max_size}"
        self.set_size_calls.append(size)
        self.keys.append(idempotency_key)
        if self.reject:
            raise CloudRejected(self.reject, 403)
        op_id = f"op-{len(self.set_size_calls)}"
        self._ops[op_id] = [self.polls_until_done, size]
        return ScaleOutcome(target_size=size, operation=PoolOperation(id=op_id, target_size=size))

    async def get_operation(self, pool: NodePoolTarget, operation: str) -> PoolOperation:
        if self.pending is not None and operation == self.pending.id:
            self.pending = None
            if self.pending_target is not None:
                self.size = self.pending_target
            return PoolOperation(id=operation, done=True)
        state = self._ops[operation]
        state[0] -= 1
        if state[0] > 0:
            return PoolOperation(id=operation)
        if self.op_error:
            return PoolOperation(id=operation, done=True, error=self.op_error)
        self.size = state[1]
        return PoolOperation(id=operation, done=True, target_size=state[1])
