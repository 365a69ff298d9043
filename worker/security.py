"""Secrets Sickbay refuses to run with: the webhook bearer token.

Whoever holds the webhook token can make Sickbay quarantine GPUs, so a token that anyone could
guess is as good as none. `check_webhook_token` refuses, with a message naming the problem:

- an empty token;
- a token shorter than `MIN_TOKEN_CHARS` (32: `openssl rand -hex 16`, 128 bits; the docs make
  one with `openssl rand -hex 32`);
- a known example or placeholder (the demo token once shipped with the compose file, or any
  token that says it wants replacing, or is a word such as "password");
- a token of fewer than `MIN_DISTINCT_CHARS` (8) distinct characters: one character repeated
  (`aaaa...`), or a word repeated (`tokentoken...`). A random token of 32 characters or more has
  far more (`openssl rand -hex 32`: all 16 hex digits, practically always).

The webhook checks at start-up and on every rotation of its token file (a weak new token is
refused and the previous one kept); `sickbay worker` checks too when the same settings reach it
(a shared env file or ConfigMap), so a weak token stops the deployment at its first process
instead of serving.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # worker.settings imports this module (the token check)
    from worker.settings import WebhookSettings

MIN_TOKEN_CHARS = 32
# The token that deploy/compose once shipped for the twin demo, and words a placeholder uses.
EXAMPLE_TOKENS = frozenset({"sickbay-demo-token-replace-me"})
PLACEHOLDER_WORDS = (
    "replace-me",
    "replaceme",
    "change-me",
    "changeme",
    "example",
    "placeholder",
    "password",
    "passw0rd",
    "your-token",
    "yourtoken",
    "insert-token",
    "dummy",
)
MIN_DISTINCT_CHARS = 8


class WeakTokenError(RuntimeError):
    """The configured webhook token is empty, short or a known example."""


def check_webhook_token(token: str, source: str = "the webhook token") -> None:
    """Raise WeakTokenError unless `token` (already stripped) is fit to guard the webhook.
    The message names `source` and the problem, never the token itself."""
    if not token:
        raise WeakTokenError(f"{source} is empty")
    lowered = token.lower()
    if token in EXAMPLE_TOKENS or any(word in lowered for word in PLACEHOLDER_WORDS):
        raise WeakTokenError(
            f"{source} is an example or placeholder token; make a real one "
            "(openssl rand -hex 32) and keep it outside the checkout"
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise WeakTokenError(
            f"{source} has {len(token)} characters, fewer than {MIN_TOKEN_CHARS}; make a "
            "longer one (openssl rand -hex 32)"
        )
    if len(set(token)) < MIN_DISTINCT_CHARS:
        raise WeakTokenError(
            f"{source} repeats fewer than {MIN_DISTINCT_CHARS} distinct characters (one "
            "character or a word over and over); make a random one (openssl rand -hex 32)"
        )


def configured_token_problem(settings: WebhookSettings) -> str | None:
    """What is wrong with the webhook token configured in `settings` (`Settings.webhook`, from
    this process's environment), or None (fine, or none configured: a process that does not
    serve the webhook needs none)."""
    if settings.webhook_token is not None:
        token, source = settings.webhook_token.get_secret_value().strip(), "SICKBAY_WEBHOOK_TOKEN"
    elif settings.webhook_token_file is not None:
        source = f"SICKBAY_WEBHOOK_TOKEN_FILE {settings.webhook_token_file}"
        try:
            token = settings.webhook_token_file.read_text().strip()
        except OSError as exc:
            return f"cannot read {source}: {exc}"
    else:
        return None
    try:
        check_webhook_token(token, source)
    except WeakTokenError as exc:
        return str(exc)
    return None
