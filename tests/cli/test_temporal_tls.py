"""TLS to Temporal as production configures it (worker/temporal.py `tls_config`).

Cases:
- a client certificate without its key, or a key without its certificate, is a start-up
  error naming both variables (in `Settings`, and as one line from `sickbay worker`), never a
  silent plaintext connection;
- a CA alone is server-side TLS: the client trusts that CA and sends no certificate, and it
  really connects: through a TLS front (a certificate from a throwaway CA, ALPN h2) to the
  Temporal dev server, which has no TLS flags of its own;
- SICKBAY_TEMPORAL_TLS=true alone is TLS with the system's roots; an API key switches TLS on;
  nothing set is plaintext.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
from pydantic import ValidationError
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import TLSConfig
from temporalio.testing import WorkflowEnvironment

from worker.settings import Settings
from worker.temporal import connect, tls_config

ROOT = Path(__file__).resolve().parents[2]
BOTH = ("SICKBAY_TEMPORAL_TLS_CERT", "SICKBAY_TEMPORAL_TLS_KEY")


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, Path]:
    ca = trustme.CA()
    leaf = ca.issue_cert("localhost", "127.0.0.1")
    files = {
        "ca": tmp_path / "ca.pem",
        "cert": tmp_path / "client.pem",
        "key": tmp_path / "client.key",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    leaf.cert_chain_pems[0].write_to_path(str(files["cert"]))
    leaf.private_key_pem.write_to_path(str(files["key"]))
    return files


@pytest.mark.parametrize("given", ["cert", "key"])
def test_half_a_client_certificate_is_refused(pem: dict[str, Path], given: str) -> None:
    with pytest.raises(ValidationError) as err:
        Settings(**{f"temporal_tls_{given}": pem[given]})
    for name in BOTH:
        assert name in str(err.value)


@pytest.mark.parametrize("given", ["CERT", "KEY"])
def test_worker_refuses_half_a_certificate_in_one_line(tmp_path: Path, given: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SICKBAY_")}
    env[f"SICKBAY_TEMPORAL_TLS_{given}"] = str(tmp_path / "x.pem")
    proc = subprocess.run(
        [sys.executable, "-m", "worker.cli", "worker"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert all(name in lines[0] for name in BOTH), lines
    assert "Traceback" not in proc.stderr


def test_ca_alone_is_server_side_tls(pem: dict[str, Path]) -> None:
    tls = tls_config(Settings(temporal_tls_ca=pem["ca"]))
    assert isinstance(tls, TLSConfig)
    assert tls.server_root_ca_cert == pem["ca"].read_bytes()
    assert tls.client_cert is None and tls.client_private_key is None


def test_pair_and_ca_is_mutual_tls(pem: dict[str, Path]) -> None:
    tls = tls_config(
        Settings(
            temporal_tls_cert=pem["cert"], temporal_tls_key=pem["key"], temporal_tls_ca=pem["ca"]
        )
    )
    assert isinstance(tls, TLSConfig)
    assert tls.client_cert == pem["cert"].read_bytes()
    assert tls.client_private_key == pem["key"].read_bytes()
    assert tls.server_root_ca_cert == pem["ca"].read_bytes()


def test_system_roots_api_key_and_plaintext() -> None:
    assert tls_config(Settings(temporal_tls=True)) is True
    assert tls_config(Settings(temporal_api_key="k")) is True
    assert tls_config(Settings()) is False


@contextlib.asynccontextmanager
async def tls_front(pem: dict[str, Path], target: str) -> AsyncIterator[tuple[str, list[int]]]:
    """A TLS-terminating TCP relay (ALPN h2, as gRPC needs) in front of `target`; yields its
    address and a list that counts completed handshakes."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pem["cert"], pem["key"])
    ctx.set_alpn_protocols(["h2"])
    host, port = target.rsplit(":", 1)
    handshakes: list[int] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handshakes.append(1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield address, handshakes
    finally:
        server.close()


@pytest.mark.devserver
async def test_ca_alone_connects_over_tls(
    dev_env: WorkflowEnvironment, pem: dict[str, Path]
) -> None:
    target = dev_env.client.service_client.config.target_host
    namespace = dev_env.client.namespace
    async with tls_front(pem, target) as (address, handshakes):
        # The certificate names localhost: connect by that name so it is verified.
        settings = Settings(
            temporal_address=address.replace("127.0.0.1", "localhost"),
            temporal_namespace=namespace,
            temporal_tls_ca=pem["ca"],
        )
        client = await connect(settings)
        described = await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=namespace)
        )
        assert described.namespace_info.name == namespace
        assert handshakes, "the client did not go through the TLS front"
