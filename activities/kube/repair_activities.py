"""`KubeRepairActivities`: the GPU rungs of the repair ladder as activities (bodies in
activities/kube/repair_jobs.py), on the same `Kube` client as `KubeActivities` and its own small
executor, so the blocking client never runs on the event loop.

Called by the remediation's repair step (workflows/remediation/repair.py); the worker registers
`KubeRepairActivities(kube, config).all()` next to the other activities (worker/main.py);
`config` (repair_jobs.RepairConfig) is the worker's repair namespace and image/command allowlist.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from temporalio import activity

from activities.defn import implements
from activities.kube import repair_jobs
from activities.kube.client import Kube, KubeError, to_application_error
from contract.repair_rungs import (
    CHECK_GPU_HOLDERS,
    CLEAN_UP_REPAIR_JOB,
    FIND_DRAIN_PODS,
    FIND_RESET_GROUP,
    START_RESET_JOB,
    START_VALIDATION_JOB,
    WAIT_FOR_NODE_GPUS,
    WAIT_FOR_REPAIR_JOB,
    CleanUpRepairJobInput,
    DrainPodsInput,
    DrainPodsResult,
    GpuHoldersInput,
    GpuHoldersResult,
    NodeGpusResult,
    RepairJobInput,
    RepairJobOutcome,
    RepairJobStarted,
    ResetGroupInput,
    ResetGroupResult,
    ValidationJobInput,
    WaitNodeGpusInput,
    WaitRepairJobInput,
)

T = TypeVar("T")


class KubeRepairActivities:
    def __init__(
        self, kube: Kube, config: repair_jobs.RepairConfig | None = None, max_threads: int = 4
    ) -> None:
        self._kube = kube
        self.config = config or repair_jobs.RepairConfig()
        self._executor = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="repair")

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.check_gpu_holders,
            self.find_reset_group,
            self.find_drain_pods,
            self.start_reset_job,
            self.start_validation_job,
            self.wait_for_repair_job,
            self.clean_up_repair_job,
            self.wait_for_node_gpus,
        ]

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, lambda: ctx.run(fn, *args))
        except KubeError as err:
            raise to_application_error(err) from err

    @implements(CHECK_GPU_HOLDERS)
    async def check_gpu_holders(self, inp: GpuHoldersInput) -> GpuHoldersResult:
        """Raises a retryable GpuStillHeld while anything holds the GPU(s): poll it with the
        retry policy before a reset."""
        return await self._run(repair_jobs.require_free, self._kube, inp)

    @implements(FIND_RESET_GROUP)
    async def find_reset_group(self, inp: ResetGroupInput) -> ResetGroupResult:
        return await self._run(repair_jobs.reset_group, self._kube, inp)

    @implements(FIND_DRAIN_PODS)
    async def find_drain_pods(self, inp: DrainPodsInput) -> DrainPodsResult:
        return await self._run(repair_jobs.drain_pods, self._kube, inp, self.config.namespace)

    @implements(START_RESET_JOB)
    async def start_reset_job(self, inp: RepairJobInput) -> RepairJobStarted:
        result = await self._run(repair_jobs.start_reset_job, self._kube, inp, self.config)
        activity.logger.info(
            "reset Job %s/%s for %s on %s (%s)",
            result.namespace,
            result.job_name,
            ",".join(inp.gpu_uuids),
            inp.node,
            "dry run" if result.dry_run else ("created" if result.created else "already there"),
        )
        return result

    @implements(START_VALIDATION_JOB)
    async def start_validation_job(self, inp: ValidationJobInput) -> RepairJobStarted:
        result = await self._run(repair_jobs.start_validation_job, self._kube, inp, self.config)
        activity.logger.info(
            "validation Job %s/%s for %s on %s (%s)",
            result.namespace,
            result.job_name,
            inp.gpu_uuid,
            inp.node,
            "dry run" if result.dry_run else ("created" if result.created else "already there"),
        )
        return result

    @implements(WAIT_FOR_REPAIR_JOB)
    async def wait_for_repair_job(self, inp: WaitRepairJobInput) -> RepairJobOutcome:
        """Retryable StillWaiting until the Job ends: poll with the retry policy, bounded by
        the rung's timeout (schedule_to_close). A non-retryable RepairJobRefused as soon as
        its pod is refused or cannot start, with the API's reason."""
        return await self._run(repair_jobs.wait_repair_job, self._kube, inp)

    @implements(CLEAN_UP_REPAIR_JOB)
    async def clean_up_repair_job(self, inp: CleanUpRepairJobInput) -> None:
        await self._run(repair_jobs.clean_up_repair_job, self._kube, inp)

    @implements(WAIT_FOR_NODE_GPUS)
    async def wait_for_node_gpus(self, inp: WaitNodeGpusInput) -> NodeGpusResult:
        """Retryable StillWaiting until the node (or its replacement) is Ready with its GPUs
        published: poll with the retry policy, bounded by the rung's timeout."""
        return await self._run(repair_jobs.wait_node_gpus, self._kube, inp)
