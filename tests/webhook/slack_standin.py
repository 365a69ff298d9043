"""A stand-in for Slack's side of interactivity: it presses a button of a message Sickbay
built and signs the request the way Slack documents ("Verifying requests from Slack"):

    basestring = "v0:" + X-Slack-Request-Timestamp + ":" + raw body
    X-Slack-Signature = "v0=" + hex(HMAC-SHA256(signing secret, basestring))

The body is `application/x-www-form-urlencoded` with one field, `payload`, holding the
block_actions JSON (type, user, actions[{action_id, value, ...}], response_url, ...).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any
from urllib.parse import urlencode


class SlackStandIn:
    def __init__(self, signing_secret: bytes) -> None:
        self.secret = signing_secret

    def press(
        self,
        message: dict[str, Any],
        action_id: str,
        user_id: str,
        *,
        at: float | None = None,
        secret: bytes | None = None,
    ) -> tuple[dict[str, str], bytes]:
        """(headers, body) of the request Slack sends when `user_id` presses the button."""
        button = next(
            element
            for block in message["blocks"]
            if block["type"] == "actions"
            for element in block["elements"]
            if element["action_id"] == action_id
        )
        payload = {
            "type": "block_actions",
            "user": {"id": user_id, "username": user_id.lower(), "team_id": "T0TEAM"},
            "api_app_id": "A0SICKBAY",
            "team": {"id": "T0TEAM", "domain": "example"},
            "container": {"type": "message", "message_ts": "1700000000.000100"},
            "trigger_id": "1234.5678.abcd",
            "response_url": "https://hooks.slack.com/actions/T0TEAM/1/abc",
            "actions": [
                {
                    "type": "button",
                    "action_id": button["action_id"],
                    "block_id": "sickbay-actions",
                    "text": button["text"],
                    "value": button["value"],
                    "action_ts": "1700000001.000200",
                }
            ],
        }
        body = urlencode({"payload": json.dumps(payload)}).encode()
        stamp = str(int(at if at is not None else time.time()))
        base = b"v0:" + stamp.encode() + b":" + body
        signature = "v0=" + hmac.new(secret or self.secret, base, hashlib.sha256).hexdigest()
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": signature,
        }
        return headers, body
