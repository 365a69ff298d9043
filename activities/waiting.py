"""A polling activity's "not yet": `still_waiting(message)`.

The polling activities (a repair Job, a node coming back, a pool resize) answer "not yet" by
raising a retryable StillWaiting error, so the caller's retry policy is the polling loop. It
is a normal answer, not a failure: raised BENIGN, the worker logs it at DEBUG (not at WARNING
with a traceback, every poll) and Temporal does not count it as a failed attempt in its
metrics. The message is still the attempt's failure in the workflow's pending activity, and the
last one is the error when the caller's deadline ends the polling.
"""

from __future__ import annotations

from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from contract.errors import ERR_STILL_WAITING


def still_waiting(message: str) -> ApplicationError:
    """The retryable, benign StillWaiting error saying `message` (what is awaited, and why)."""
    return ApplicationError(
        message, type=ERR_STILL_WAITING, category=ApplicationErrorCategory.BENIGN
    )
