"""The peer Sickbay is compared with: a straight-line, non-durable alert receiver.

    python -m bench.peer --port 9100 --kubeconfig /path/kubeconfig [--prefix peer-]

What a team would write in an afternoon: an HTTP server that takes the same Alertmanager
notification, and for each firing alert makes the same API calls as Sickbay's hot path with
the same `kubernetes` client: resolve the device (list the node's ResourceSlices, find the
device whose uuid attribute is the alert's UUID, read the node), then create the
DeviceTaintRule. No retries, no dedup, no record of what it did: a crash or a 500 loses the
action. It names its rules `<prefix><sickbay rule name>` so both can run against one twin.
"""

from __future__ import annotations

import argparse
import json
import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from contract.names import taint_rule_name

log = logging.getLogger("bench.peer")
GROUP = "resource.k8s.io"
AGENT = "sickbay-bench-peer/1"


def taint_version(api: client.ApiClient) -> str:
    """The served resource.k8s.io version that has devicetaintrules (asked once at start)."""
    groups = client.ApisApi(api).get_api_versions()
    for g in groups.groups:
        if g.name != GROUP:
            continue
        for v in g.versions:
            res = client.CustomObjectsApi(api).get_api_resources(GROUP, v.version)
            if any(r.name == "devicetaintrules" for r in res.resources or []):
                return str(v.version)
    raise SystemExit("the cluster serves no DeviceTaintRule version")


class Peer:
    def __init__(self, kubeconfig: str, prefix: str, user_agent: str = AGENT) -> None:
        self.api = config.new_client_from_config(kubeconfig)
        self.api.user_agent = user_agent  # told apart in the twin's request log
        self.core = client.CoreV1Api(self.api)
        self.resource = client.ResourceV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.version = taint_version(self.api)
        self.prefix = prefix

    def remediate(self, labels: dict[str, str]) -> str:
        node, uuid = labels["Hostname"], labels["UUID"]
        return self.create(node, uuid, self.resolve(node, uuid))

    def resolve(self, node: str, uuid: str) -> tuple[str, str, str]:
        """(driver, pool, device) of the GPU whose uuid attribute is `uuid` on `node`: the
        node's ResourceSlices (field selector), then the node (its pool label, as Sickbay
        reads it). LookupError when no device has that uuid."""
        slices = self.resource.list_resource_slice(field_selector=f"spec.nodeName={node}")
        target = None
        for s in slices.items:
            for d in s.spec.devices or []:
                attrs = d.attributes or {}
                got = attrs.get("uuid")
                if got is not None and got.string == uuid:
                    target = (s.spec.driver, s.spec.pool.name, d.name)
        if target is None:
            raise LookupError(f"no device with uuid {uuid} on {node}")
        self.core.read_node(node)  # the node pool label, as Sickbay reads it
        return target

    def create(self, node: str, uuid: str, target: tuple[str, str, str]) -> str:
        """Create the DeviceTaintRule `<prefix><sickbay rule name>` for the resolved device;
        one that already exists (409) is fine. Returns the rule's name."""
        driver, pool, device = target
        name = self.prefix + taint_rule_name(node, uuid)
        body: dict[str, Any] = {
            "apiVersion": f"{GROUP}/{self.version}",
            "kind": "DeviceTaintRule",
            "metadata": {"name": name},
            "spec": {
                "deviceSelector": {"driver": driver, "pool": pool, "device": device},
                "taint": {"key": "sickbay.dev/unhealthy", "value": "xid", "effect": "NoExecute"},
            },
        }
        try:
            self.custom.create_cluster_custom_object(GROUP, self.version, "devicetaintrules", body)
        except ApiException as err:
            if err.status != 409:
                raise
        return name


def serve(port: int, peer: Peer) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._reply(200, {"ok": True})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                payload = json.loads(raw)
                done = [
                    peer.remediate(a["labels"])
                    for a in payload["alerts"]
                    if a.get("status") == "firing"
                ]
            except (ValueError, KeyError, LookupError, ApiException) as err:
                self._reply(500, {"error": str(err)})
                return
            self._reply(200, {"rules": done})

        def _reply(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    try:
        server.serve_forever()
    finally:
        server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--prefix", default="peer-")
    args = parser.parse_args()
    serve(args.port, Peer(args.kubeconfig, args.prefix))


if __name__ == "__main__":
    main()
