"""A throwaway certificate authority and API server certificate, for a twin served over TLS.

A pod reaches its API server the in-cluster way: `https://$KUBERNETES_SERVICE_HOST:
$KUBERNETES_SERVICE_PORT`, trusting the cluster CA at
/var/run/secrets/kubernetes.io/serviceaccount/ca.crt (the official client's in-cluster
configuration knows no plain-HTTP variant). `throwaway_pki()` makes what a real control plane's
bootstrap makes (a self-signed CA, a server certificate it signs, valid for the API server's
names and addresses), in memory, for one test or one session; nothing is kept.

    pki = throwaway_pki(dns=["kubernetes.default.svc"], ips=["127.0.0.1", "10.96.0.1"])
    twin = Twin(tls=pki)                       # serves https://127.0.0.1:<port>
    pki.ca_pem                                 # the bundle clients trust

Needs the `trustme` package (a development dependency); imported only when used.
"""

from __future__ import annotations

import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def server_context(self) -> ssl.SSLContext:
        """A server-side context presenting the certificate (TLS 1.2+, as kube-apiserver)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        # load_cert_chain reads files only: a private temporary directory, removed at once.
        with tempfile.TemporaryDirectory(prefix="twin-tls-") as directory:
            cert, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
            cert.write_bytes(self.cert_pem)
            key.touch(mode=0o600)
            key.write_bytes(self.key_pem)
            ctx.load_cert_chain(cert, key)
        return ctx


def throwaway_pki(
    dns: list[str] | tuple[str, ...] = (),
    ips: list[str] | tuple[str, ...] = ("127.0.0.1",),
) -> Pki:
    """A new CA and a server certificate for `dns` names and `ips` (trustme's defaults)."""
    import trustme

    ca = trustme.CA(organization_name="sickbay twin")
    leaf = ca.issue_cert(*dns, *ips, common_name="kube-apiserver")
    return Pki(
        ca_pem=ca.cert_pem.bytes(),
        cert_pem=b"".join(pem.bytes() for pem in leaf.cert_chain_pems),
        key_pem=leaf.private_key_pem.bytes(),
    )
