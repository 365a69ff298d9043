"""Node-pool providers. `CloudActivities` is the activity class the worker registers."""

from activities.cloud.activities import CloudActivities

__all__ = ["CloudActivities"]
