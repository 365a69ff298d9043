"""Kubernetes activities (DRA and device-plugin clusters, Kubernetes 1.34-1.37)."""

from activities.kube.activities import KubeActivities
from activities.kube.client import KubeSettings

__all__ = ["KubeActivities", "KubeSettings"]
