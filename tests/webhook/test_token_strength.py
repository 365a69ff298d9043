"""Weak webhook tokens are refused: whoever holds the token can make Sickbay quarantine GPUs.

Cases:
- `check_webhook_token`: empty, shorter than 32 characters, the example token once shipped with
  the compose file, placeholders ("replace-me", "changeme", "password", ...), one character
  repeated and a word repeated are refused with a message
  naming the problem and never the token; a 64-hex-character token is accepted;
- `create_app` refuses to build with such a token, from SICKBAY_WEBHOOK_TOKEN or a token file;
- a token file rotated to a weak token keeps the previous (good) token;
- `sickbay webhook` with the example token in its token file exits 2 with the reason, before
  serving;
- `sickbay worker` with a weak SICKBAY_WEBHOOK_TOKEN(_FILE) in its environment (a shared env
  file or ConfigMap) exits 2 before it connects to Temporal.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from worker.security import (
    EXAMPLE_TOKENS,
    MIN_TOKEN_CHARS,
    WeakTokenError,
    check_webhook_token,
    configured_token_problem,
)
from worker.settings import Settings, WebhookSettings
from worker.webhook.app import create_app
from worker.webhook.auth import TokenSource

SICKBAY = str(Path(sys.executable).parent / "sickbay")
EXAMPLE = next(iter(EXAMPLE_TOKENS))
GOOD = secrets.token_hex(32)
WEAK = {
    "empty": ("", "empty"),
    "short": ("a" * (MIN_TOKEN_CHARS - 1), "fewer than 32"),
    "example": (EXAMPLE, "example or placeholder"),
    "placeholder": ("changeme-" + "x" * 40, "example or placeholder"),
    "password": ("Password-" + secrets.token_hex(20), "example or placeholder"),
    "one-character": ("x" * (MIN_TOKEN_CHARS + 8), "distinct characters"),
    "repeated-word": ("token" * 10, "distinct characters"),
}


@pytest.mark.parametrize("case", sorted(WEAK))
def test_weak_tokens_are_refused_with_the_reason(case: str) -> None:
    token, reason = WEAK[case]
    with pytest.raises(WeakTokenError, match=reason) as info:
        check_webhook_token(token, "SICKBAY_WEBHOOK_TOKEN")
    assert "SICKBAY_WEBHOOK_TOKEN" in str(info.value)
    if token:
        assert token not in str(info.value), "the message must not repeat the token"


def test_a_random_token_is_accepted() -> None:
    check_webhook_token(GOOD)
    check_webhook_token(secrets.token_urlsafe(MIN_TOKEN_CHARS))


@pytest.mark.parametrize("case", ["short", "example", "placeholder"])
def test_create_app_refuses_a_weak_token(case: str, tmp_path: Path) -> None:
    token, reason = WEAK[case]
    with pytest.raises(RuntimeError, match=reason):
        create_app(Settings(), webhook=WebhookSettings(webhook_token=SecretStr(token)))
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    with pytest.raises(RuntimeError, match=reason):
        create_app(Settings(), webhook=WebhookSettings(webhook_token_file=token_file))


def test_rotation_to_a_weak_token_keeps_the_previous_one(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(GOOD + "\n")
    source = TokenSource(WebhookSettings(webhook_token_file=token_file))
    assert source.current() == GOOD.encode()
    token_file.write_text(EXAMPLE + "\n")
    os.utime(token_file, ns=(1, 1))  # a different stamp even on a coarse-clock file system
    assert source.current() == GOOD.encode()
    newer = secrets.token_hex(32)
    token_file.write_text(newer + "\n")
    assert source.current() == newer.encode()


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SICKBAY_")}
    env.pop("KUBECONFIG", None)
    env.update(extra)
    return env


def test_webhook_cli_refuses_the_example_token(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(EXAMPLE + "\n")
    proc = subprocess.run(
        [SICKBAY, "webhook", "--host", "127.0.0.1", "--port", "0"],
        env=_clean_env(
            SICKBAY_TEMPORAL_ADDRESS="127.0.0.1:1", SICKBAY_WEBHOOK_TOKEN_FILE=str(token_file)
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "example or placeholder" in proc.stderr
    assert EXAMPLE not in proc.stderr + proc.stdout


@pytest.mark.parametrize("how", ["env", "file"])
def test_worker_refuses_a_weak_webhook_token(how: str, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("short\n")
    extra = (
        {"SICKBAY_WEBHOOK_TOKEN": "short"}
        if how == "env"
        else {"SICKBAY_WEBHOOK_TOKEN_FILE": str(token_file)}
    )
    proc = subprocess.run(
        [SICKBAY, "worker"],
        # Nothing listens on port 1: a worker that got as far as connecting would fail there
        # with another code and message.
        env=_clean_env(SICKBAY_TEMPORAL_ADDRESS="127.0.0.1:1", SICKBAY_METRICS_PORT="0", **extra),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "fewer than 32" in proc.stdout + proc.stderr
    assert "SICKBAY_WEBHOOK_TOKEN" in proc.stdout + proc.stderr


def test_no_token_configured_is_no_problem_for_the_worker() -> None:
    assert (
        configured_token_problem(WebhookSettings(webhook_token=None, webhook_token_file=None))
        is None
    )
