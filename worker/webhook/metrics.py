"""The webhook's Prometheus metrics, in a registry of their own (one per app)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class WebhookMetrics:
    """Prometheus metrics in a registry of their own (one per app, so tests can build many)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.alerts_received = Counter(
            "sickbay_webhook_alerts_received",
            "Alerts received in well-formed notifications",
            ["status"],
            registry=r,
        )
        self.alerts_accepted = Counter(
            "sickbay_webhook_alerts_accepted",
            "Alerts handed to Temporal (or resolved with no workflow to tell)",
            ["status"],
            registry=r,
        )
        self.alerts_rejected = Counter(
            "sickbay_webhook_alerts_rejected",
            "Alerts not acted on, by reason (unmatched, temporal-unavailable, ...)",
            ["reason"],
            registry=r,
        )
        self.workflows = Counter(
            "sickbay_webhook_workflows",
            "Workflow calls by result: started, signalled, resolved-signalled, "
            "resolved-no-workflow",
            ["result"],
            registry=r,
        )
        self.requests = Counter(
            "sickbay_webhook_requests", "Notifications by HTTP status", ["code"], registry=r
        )
        self.requests_rejected = Counter(
            "sickbay_webhook_requests_rejected",
            "Notifications refused before any alert was handled, by reason",
            ["reason"],
            registry=r,
        )
        self.latency = Histogram(
            "sickbay_webhook_request_seconds",
            "Time to handle one notification, from first byte read to response",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.alerts_deduplicated = Counter(
            "sickbay_webhook_alerts_deduplicated",
            "Alerts acknowledged without a Temporal call of their own, because an identical "
            "delivery was in the same notification, in flight, or accepted recently",
            ["via"],
            registry=r,
        )
        self.temporal_calls = Counter(
            "sickbay_webhook_temporal_calls",
            "Temporal RPCs issued for alerts, by kind (signal-with-start, signal)",
            ["call"],
            registry=r,
        )
        self.call_latency = Histogram(
            "sickbay_webhook_temporal_call_seconds",
            "Time of one signal-with-start / signal call, including the wait for a slot",
            buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.call_alerts = Histogram(
            "sickbay_webhook_temporal_call_alerts",
            "Distinct alerts (delivery keys) carried by one Temporal call",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
            registry=r,
        )
        self.deliveries_dropped = Counter(
            "sickbay_webhook_deliveries_dropped",
            "Queued deliveries not sent because every notification waiting for them gave up",
            registry=r,
        )
        self.spooled = Counter(
            "sickbay_webhook_alerts_spooled",
            "Alerts acknowledged before Temporal accepted them: journaled to the spool",
            registry=r,
        )
        self.spool_pending = Gauge(
            "sickbay_webhook_spool_pending",
            "Spooled alerts Temporal has not accepted yet",
            registry=r,
        )
        self.spool_redelivered = Counter(
            "sickbay_webhook_spool_redelivered",
            "Spooled alerts sent again (after a failed call, or left by a previous process)",
            registry=r,
        )
        self.spool_refused = Counter(
            "sickbay_webhook_spool_refused",
            "Times the spool took no more alerts, by reason (count, bytes, disk): the "
            "notification waited for Temporal instead (503 past the deadline)",
            ["reason"],
            registry=r,
        )
        self.spool_given_up = Counter(
            "sickbay_webhook_spool_given_up",
            "Spooled alerts dropped after Temporal refused them for good (logged at ERROR)",
            registry=r,
        )
