"""ApplicationError types: every error-type string a layer raises or matches on.

Activities raise them and workflows (retry policies' `non_retryable_error_types`, failure
handling) match on them by *name*, and they are recorded in histories: add new ones, never
rename. Non-retryable unless stated.
"""

from __future__ import annotations

ERR_DEVICE_NOT_FOUND = "DeviceNotFound"
ERR_FORBIDDEN = "KubeForbidden"
ERR_INVALID_INPUT = "InvalidInput"
ERR_RUNBOOK_INVALID = "RunbookInvalid"
ERR_NO_TAINT_API = "DeviceTaintRuleUnavailable"
# A HAMi annotation (placement or registration) Sickbay cannot read exactly: never guessed.
ERR_HAMI_UNREADABLE = "HamiAnnotationUnreadable"
ERR_CLOUD_REJECTED = "CloudRequestRejected"  # 4xx from a provider: quota, auth
ERR_CLOUD_UNAVAILABLE = "CloudUnavailable"  # retryable: 429/5xx/transport from a provider
ERR_CHANNEL_UNAVAILABLE = "NotificationChannelUnavailable"  # retryable: 429/5xx/transport
ERR_POOL_AT_MAX = "NodePoolAtMaxSize"
ERR_CHANNEL_REJECTED = "NotificationRejected"
ERR_CONFIG = "ConfigurationError"
ERR_STILL_WAITING = "StillWaiting"  # retryable: used by polling activities

# The Kubernetes API (activities/kube): retryable, Temporal retries them with the caller's policy.
ERR_KUBE_UNAVAILABLE = "KubeUnavailable"  # 429/5xx/timeouts
ERR_KUBE_CONFLICT = "KubeConflict"  # 409: re-read and retry
# A 404 on something that is not the activity's target (an owner deleted mid-read): the next
# attempt reads a fresher state.
ERR_KUBE_NOT_FOUND = "KubeNotFound"

# The maintenance drain workflow: every drain it started failed.
ERR_MAINTENANCE_FAILED = "MaintenanceFailed"

# Closed-loop repair (non-retryable unless said otherwise).
ERR_GPU_HELD = "GpuStillHeld"  # something else holds the GPU: no reset (retryable: wait)
ERR_PROVIDER_NOT_CONFIGURED = "RepairProviderNotConfigured"
ERR_PROVIDER_REFUSED = "RepairProviderRefused"
# A repair Job's pods are refused or cannot start (the API's own reason: FailedCreate, image
# pull): a configuration problem no rung fixes, escalated at once (non-retryable).
ERR_REPAIR_JOB_REFUSED = "RepairJobRefused"
# A repair / validation image or command outside the operator's allowlist, or none allowlisted.
ERR_REPAIR_NOT_ALLOWED = "RepairNotAllowed"
# A runbook with requireVerifiedActors refused an action from an unverified sender.
ERR_UNVERIFIED_ACTOR = "UnverifiedActor"
