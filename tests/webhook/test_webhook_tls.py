"""`sickbay webhook` over TLS from certificate/key files, reloaded when they change.

Certificates come from a throwaway CA (trustme); the webhook is the real CLI process.

Cases:
- with SICKBAY_WEBHOOK_TLS_CERT_FILE/_KEY_FILE it serves HTTPS: a client trusting the CA
  gets /healthz and an authenticated POST; plain HTTP on the same port gets nowhere;
- the files are rewritten with a certificate from another CA (as cert-manager renews a
  Secret): new connections get the new certificate without a restart (a client trusting only
  the new CA connects, one trusting only the old CA is refused);
- files that do not load (a key that does not match the certificate) keep the previous
  certificate, and the next good pair is picked up;
- unreadable TLS files, or only one of the pair, stop it at start-up (exit 2) with the reason.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import trustme

from harness.stack import free_port
from tests.webhook.helpers import TOKEN, payload

SICKBAY = str(Path(sys.executable).parent / "sickbay")
START_WITHIN = 30.0
RELOADED_WITHIN = 30.0


def _env(cert: Path, key: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SICKBAY_")}
    env.update(
        SICKBAY_TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}",  # Temporal down: 503 for alerts
        SICKBAY_WEBHOOK_TEMPORAL_TIMEOUT="1",
        SICKBAY_WEBHOOK_TOKEN=TOKEN,
        SICKBAY_WEBHOOK_TLS_CERT_FILE=str(cert),
        SICKBAY_WEBHOOK_TLS_KEY_FILE=str(key),
    )
    env.update(extra)
    return env


def _write_pair(ca: trustme.CA, cert: Path, key: Path) -> None:
    """Replace both files the way a mounted Secret changes: new files renamed into place."""
    issued = ca.issue_cert("127.0.0.1", "localhost")
    for path, data in (
        (key, issued.private_key_pem.bytes()),
        (cert, b"".join(b.bytes() for b in issued.cert_chain_pems)),
    ):
        tmp = path.with_suffix(".new")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def _client(ca: trustme.CA) -> httpx.Client:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return httpx.Client(verify=ctx, timeout=10)


def _https_ok(ca: trustme.CA, url: str) -> bool:
    try:
        with _client(ca) as http:
            return http.get(url).status_code == 200
    except httpx.ConnectError:  # certificate verify failed
        return False


@contextmanager
def _webhook(env: dict[str, str], log: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [SICKBAY, "webhook", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc, port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _until(check, within: float, what: str, log: Path) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, (
            f"{what} not within {within:.0f} s:\n" + (log.read_text()[-3000:])
        )
        time.sleep(0.2)


def test_serves_https_and_reloads_renewed_certificates(tmp_path: Path) -> None:
    first, second, third = trustme.CA(), trustme.CA(), trustme.CA()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    _write_pair(first, cert, key)
    log = tmp_path / "webhook.log"
    with _webhook(_env(cert, key), log) as (proc, port):
        url = f"https://127.0.0.1:{port}"

        def up() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            return _https_ok(first, f"{url}/healthz")

        _until(up, START_WITHIN, "HTTPS /healthz", log)
        with _client(first) as http:
            resp = http.post(
                f"{url}/v1/alertmanager",
                json=payload(),
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            assert resp.status_code in (200, 503), resp.text  # authenticated; Temporal down
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)

        _write_pair(second, cert, key)  # renewed by another CA
        _until(lambda: _https_ok(second, f"{url}/healthz"), RELOADED_WITHIN, "new cert", log)
        assert not _https_ok(first, f"{url}/healthz"), "the old certificate is still served"

        # A key that does not match the certificate: the previous pair stays in service.
        mismatched = third.issue_cert("127.0.0.1")
        cert.write_bytes(b"".join(b.bytes() for b in mismatched.cert_chain_pems))
        assert _https_ok(second, f"{url}/healthz")
        _until(lambda: "do not load" in log.read_text(), RELOADED_WITHIN, "the warning", log)
        _write_pair(third, cert, key)
        _until(lambda: _https_ok(third, f"{url}/healthz"), RELOADED_WITHIN, "third cert", log)
        assert proc.poll() is None


@pytest.mark.parametrize("case", ["missing", "half"])
def test_bad_tls_configuration_stops_it_at_start_up(case: str, tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    env = _env(cert, key)
    if case == "half":
        _write_pair(trustme.CA(), cert, key)
        del env["SICKBAY_WEBHOOK_TLS_KEY_FILE"]
    proc = subprocess.run(
        [SICKBAY, "webhook", "--host", "127.0.0.1", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    expected = "cannot load the webhook TLS certificate" if case == "missing" else "go together"
    assert expected in proc.stderr, proc.stderr
