"""What each channel receives, built from an `Incident` (pure functions, no I/O).

- PagerDuty Events API v2: `trigger` carries the full payload (summary, source, severity,
  component, group, class, custom_details with the timeline summary, a link to the workflow);
  `acknowledge` / `resolve` carry only the routing and dedup keys, as the API asks. The dedup
  key is the incident's own (`Incident.dedup_key`: workflow id + first run id), so every event
  of one incident lands on one alert and a later incident of the same GPU is a new one.
- Slack incoming webhook: `text` (notification fallback) plus Block Kit blocks a person can
  read at 3 a.m.: device, node, workload, phase, what was done, what is needed, a link.
- Generic webhook: the incident and its timeline as JSON.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from contract.notify import Incident
from contract.remediation import Phase, TimelineEntry

PD_SUMMARY_MAX = 1024  # Events API v2 limit on payload.summary
PD_DEDUP_MAX = 255  # ... and on dedup_key
SLACK_TEXT_MAX = 3000  # a section block's text limit

_ACTION_WORDS = {
    "trigger": "needs attention",
    "acknowledge": "acknowledged",
    "resolve": "resolved",
}


def timeline_lines(timeline: list[TimelineEntry], limit: int) -> list[str]:
    """`HH:MM:SSZ phase: action -> outcome (reason) [actor]`, the last `limit` entries."""
    lines = []
    for entry in timeline[-limit:] if limit else []:
        line = f"{entry.at.astimezone(UTC):%H:%M:%S}Z {entry.phase.value}: {entry.action}"
        if entry.outcome:
            line += f" -> {entry.outcome}"
        if entry.reason:
            line += f" ({entry.reason})"
        if entry.who():
            line += f" [{entry.who()}]"
        lines.append(line)
    return lines


def pagerduty_event(
    incident: Incident,
    action: str,
    routing_key: str,
    *,
    source: str = "sickbay",
    event_class: str = "gpu-remediation",
    max_timeline: int = 20,
    now: datetime | None = None,
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": action,
        "dedup_key": (incident.dedup_key or incident.id)[:PD_DEDUP_MAX],
    }
    if action != "trigger":
        return event
    details: dict[str, Any] = {
        "cluster": incident.cluster,
        "device": incident.device,
        "node": incident.node,
        "node_pool": incident.node_pool,
        "workload": incident.workload,
        "reason": incident.reason,
        "phase": incident.phase.value,
        "done": incident.done,
        "needed": incident.needed,
        "timeline": timeline_lines(incident.timeline, max_timeline),
    }
    if incident.ui_url:
        details["workflow"] = incident.ui_url
    payload: dict[str, Any] = {
        "summary": incident.summary[:PD_SUMMARY_MAX],
        "source": incident.node or source,
        "severity": incident.severity,
        "timestamp": (now or datetime.now(UTC)).isoformat(),
        "component": incident.device,
        "class": event_class,
        "custom_details": {k: v for k, v in details.items() if v not in (None, "", [])},
    }
    if incident.workload:
        payload["group"] = incident.workload
    event["payload"] = payload
    event["client"] = "Sickbay"
    if incident.ui_url:
        event["client_url"] = incident.ui_url
        event["links"] = [{"href": incident.ui_url, "text": "Sickbay workflow in Temporal UI"}]
    return event


def _escape(text: str) -> str:
    """Slack mrkdwn control characters (the only three Slack asks to escape)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# The buttons of a Slack message, by phase: what a person may do now. Each press reaches the
# webhook's `POST /v1/slack/actions` (the Slack app's interactivity URL), which checks Slack's
# signature, maps the Slack user to a Kubernetes identity and authorizes it with a
# SubjectAccessReview before acting (worker/webhook/actions.py). action_id -> (label, style,
# confirmation text or "").
_BUTTONS: dict[Phase, list[tuple[str, str, str, str]]] = {
    Phase.AWAITING_APPROVAL: [
        ("sickbay-approve", "Approve", "primary", ""),
        ("sickbay-reject", "Reject", "danger", "Reject: the device is NOT quarantined."),
        ("sickbay-abort", "Abort", "", "Abort: stop this remediation."),
    ],
    Phase.HOLDING: [
        ("sickbay-repaired", "Mark repaired", "primary", "Release the device's quarantine?"),
        ("sickbay-abort", "Abort", "danger", "Abort: undo the quarantine and stop."),
    ],
}
# An escalation is sent as the remediation enters `escalated`, on its way to holding the
# device (or closing): the holding buttons (a closed one answers "no running remediation").
_BUTTONS[Phase.ESCALATED] = _BUTTONS[Phase.HOLDING]


def _buttons(incident: Incident) -> list[dict[str, Any]]:
    if incident.reason == "application-error":
        return []  # told to the workload's owners: nothing is held, nothing to act on
    out: list[dict[str, Any]] = []
    for action_id, label, style, confirm in _BUTTONS.get(incident.phase, []):
        button: dict[str, Any] = {
            "type": "button",
            "action_id": action_id,
            "text": {"type": "plain_text", "text": label},
            "value": incident.id,  # the workflow id
        }
        if style:
            button["style"] = style
        if confirm:
            button["confirm"] = {
                "title": {"type": "plain_text", "text": f"{label}?"},
                "text": {"type": "plain_text", "text": f"{confirm} ({incident.device})"[:300]},
                "confirm": {"type": "plain_text", "text": label},
                "deny": {"type": "plain_text", "text": "Cancel"},
            }
        out.append(button)
    return out


def slack_message(incident: Incident, action: str, *, max_done: int = 8) -> dict[str, Any]:
    icon = {"trigger": ":rotating_light:", "acknowledge": ":eyes:", "resolve": ":white_check_mark:"}
    words = _ACTION_WORDS.get(action, action)
    title = f"GPU {incident.device} {words} ({incident.phase.value})"
    text = f"{icon.get(action, '')} {_escape(title)}: {_escape(incident.summary)}".strip()
    fields = [
        ("Device", incident.device),
        ("Node", incident.node or "unknown"),
        ("Workload", incident.workload or "none found"),
        ("Phase", incident.phase.value),
        ("Severity", incident.severity),
    ]
    if incident.reason:
        fields.append(("Reason", incident.reason))
    if incident.node_pool:
        fields.append(("Node pool", incident.node_pool))
    if incident.cluster:
        fields.insert(0, ("Cluster", incident.cluster))
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:150], "emoji": True}},
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": _escape(incident.summary)[:SLACK_TEXT_MAX]},
        },
        {
            "type": "section",
            "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{_escape(v)}"} for k, v in fields],
        },
    ]
    if incident.done:
        done = "\n".join(f"• {_escape(item)}" for item in incident.done[-max_done:])
        blocks.append(
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": f"*What was done*\n{done}"[:SLACK_TEXT_MAX]},
            }
        )
    if incident.needed and action == "trigger":
        blocks.append(
            {
                "type": "section",
                "text": {
                    "type": "mrkdwn",
                    "text": f"*What is needed*\n{_escape(incident.needed)}"[:SLACK_TEXT_MAX],
                },
            }
        )
    buttons = _buttons(incident) if action == "trigger" else []
    if buttons:
        blocks.append({"type": "actions", "block_id": "sickbay-actions", "elements": buttons})
    if incident.ui_url:
        blocks.append(
            {
                "type": "context",
                "elements": [
                    {
                        "type": "mrkdwn",
                        "text": f"<{incident.ui_url}|Open the workflow in Temporal UI> · {incident.id}",
                    }
                ],
            }
        )
    return {"text": text, "blocks": blocks}


def webhook_body(incident: Incident, action: str, now: datetime | None = None) -> dict[str, Any]:
    return {
        "source": "sickbay",
        "version": "v1",
        "action": action,
        "sent_at": (now or datetime.now(UTC)).isoformat(),
        "incident": incident.model_dump(mode="json"),
        "timeline_summary": timeline_lines(incident.timeline, len(incident.timeline)),
    }
