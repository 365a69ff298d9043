"""HTTP routes for faults, alerts, API fault injection and node pools (`/twin/...`).

All bodies are JSON; errors are Kubernetes `Status` bodies (400 bad input, 404 unknown node,
GPU or pool), never a 500 for a client mistake.

    GET    /twin/gpus[?node=N]                 physical GPUs, their devices and health
    GET    /twin/faults                        active device faults
    POST   /twin/faults                        {"node", "gpu", "xid": 79 | "degrade": "nvlink" |
                                               "vanish": true, "driverTaint": false}   -> 201
                                               or {"items": [<that body>, ...]}: all checked
                                               first, none made if one is bad
    POST   /twin/faults/recover                {"node", "gpu"?}  (no gpu: the whole node)
    GET    /twin/known-faults                  {"ignoreDeviceTaintRules", "expiredTolerationBug"}
    PUT    /twin/known-faults                  same body; omitted keys stay as they are
    GET    /twin/api-faults                    injection rules
    POST   /twin/api-faults                    {"kind": "500|429|409|timeout|reset|delay", "verb",
                                               "resource", "rate", "count", "timeoutSeconds",
                                               "match": text the decoded path+query contains}
    DELETE /twin/api-faults[/<id>]             remove one rule or all
    POST   /twin/api-faults/drop-watches       cut every open watch connection mid-stream
    POST   /twin/api-faults/restart            {"downSeconds": 2, "compact": true}: an API server
                                               restart (watches cut, requests reset while down,
                                               watch history gone: old resourceVersions get 410)
    GET    /twin/alerts                        {"active": [...], "sent": [...]} (Alertmanager)
    PUT    /twin/alerts                        {"url", "token", "groupWait", "groupInterval",
                                               "repeatInterval"}: where and how often to notify
    GET    /twin/pools                         node pools: nodes, target, provisioning
    POST   /twin/pools/<pool>/resize           {"size": 3, "delay"?: seconds}
    PUT    /twin/pools/<pool>/cloud            {"latency": seconds}: how long (simulated) the
                                               twin cloud API's next resize operations run;
                                               {"aks": {"subscription", "resourceGroup",
                                               "vmss"}}: the pool's nodes become AKS VMSS VMs
                                               (providerIDs, ARM endpoints); {"armAnswerDelay":
                                               real seconds ARM holds its answer after acting}
    GET    /twin/pools/<pool>/cloud            {"instanceCalls": [[action, instance], ...]}:
                                               every VM reset / recreate the cloud API acted on
    POST   /twin/gpu-plugins                   run GPU plugin pods on every GPU node (upgrade.py)
    GET    /twin/upgrades                      node upgrades that broke their GPU plugin
    POST   /twin/upgrades                      {"node", "kubelet"?, "runtime"?, "breaks": "hook|
                                               nvml|socket", "healsOnRestart": true} -> 201
    POST   /twin/upgrades/rollout              {"node", "breaks": "hook|nvml", "healsOnRestart":
                                               false} -> 201: a plugin rollout breaks it, the
                                               kubelet running on (its grace period shows)
    POST   /twin/upgrades/kubelet-restart      {"node", "republishAfter": 5}: a routine kubelet
                                               restart: the GPUs gone until the plugin registers
                                               again (simulated seconds later)
    POST   /twin/upgrades/plugin-restart       {"node", "startsAfter": 10}: a healthy plugin
                                               rollout: the new pod ContainerCreating, then
                                               running (simulated seconds later)
    POST   /twin/upgrades/reboot               {"node", "startsAfter": 60}: the node rebooted
                                               outside Sickbay: no GPU counted, the plugin pod
                                               ContainerCreating, then registering
    POST   /twin/upgrades/start-now            {"node"}: the plugin a reboot or rollout is
                                               starting registers now
    POST   /twin/upgrades/recover              {"node"}: the break is fixed

`dispatch(twin, method, parts, query, body)` answers one request (parts = the path after
`/twin/`) and returns `(status, json)` or None for a path it does not serve. The controller
manager mounts it on the twin's API server with `install_server_hooks(twin)`: a subclass of
the server's request handler serves these routes and runs API fault injection
(`faults.ApiFaults.intercept`) once a request's verb and resource are known. If the server
ever changes shape, `FaultApiServer` serves the same routes on a port of its own.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from twin import errors
from twin.faults import FaultError

log = logging.getLogger(__name__)

PREFIXES = (
    "gpus",
    "faults",
    "known-faults",
    "api-faults",
    "alerts",
    "pools",
    "gpu-plugins",
    "upgrades",
)


def _manager(twin: Any) -> Any:
    manager = (getattr(twin, "extensions", None) or {}).get("controllers")
    if manager is None:
        raise errors.ApiError(503, "ServiceUnavailable", "the twin's controllers are not running")
    return manager


def _body(raw: bytes | dict[str, Any] | None) -> dict[str, Any]:
    if raw is None or raw == b"":
        return {}
    if isinstance(raw, dict):
        return raw
    try:
        data = json.loads(raw)
    except ValueError as err:
        raise errors.bad_request(f"request body is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise errors.bad_request("request body must be a JSON object")
    return data


def _fault_batch(data: dict[str, Any]) -> list[dict[str, Any]]:
    """`{"items": [<a POST /twin/faults body>, ...]}` -> FaultInjector.fail_many's specs."""
    items = data.get("items")
    if not isinstance(items, list) or not items:
        raise FaultError("items must be a non-empty list of faults")
    specs = []
    for n, item in enumerate(items):
        if not isinstance(item, dict) or not item.get("node"):
            raise FaultError(f"fault {n}: node is required")
        specs.append(
            {
                "node": str(item["node"]),
                "gpu": item.get("gpu"),
                "xid": _int(item, "xid"),
                "degrade": item.get("degrade"),
                "vanish": bool(item.get("vanish")),
                "driver_taint": bool(item.get("driverTaint")),
            }
        )
    return specs


def _int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool):
        raise errors.bad_request(f"{key} must be an integer")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise errors.bad_request(f"{key} must be an integer, not {value!r}") from None


def _gpu_json(manager: Any, gpu: Any) -> dict[str, Any]:
    devices = []
    for resource_id in gpu.devices:
        health, message, _fatal = manager.faults.health(gpu.node, resource_id)
        devices.append({"resourceID": resource_id, "health": health, "message": message})
    return {
        "node": gpu.node,
        "index": gpu.index,
        "uuid": gpu.uuid,
        "model": gpu.model,
        "pciBusID": gpu.pci_bus_id,
        "devices": devices,
    }


def _cloud_pool(twin: Any, name: str, data: dict[str, Any]) -> dict[str, Any]:
    """Set the twin cloud API's knobs for one pool: a slow resize, the pool's nodes as AKS VMSS
    VMs (their providerIDs, served by the ARM endpoints), ARM's answers held (drills)."""
    cloud = (getattr(twin, "extensions", None) or {}).get("cloud")
    if cloud is None:
        raise FaultError("the twin serves no cloud API (twin up --no-cloud-api)", 404)
    pool = cloud.api.pools.get(name)
    if pool is None:
        raise FaultError(f'the twin cloud API has no node pool "{name}"', 404)
    unknown = set(data) - {"latency", "aks", "armAnswerDelay", "eks", "awsAnswerDelay"}
    if unknown:
        raise FaultError(f"unknown cloud pool setting(s): {', '.join(sorted(unknown))}")
    if "latency" in data:
        latency = data["latency"]
        if isinstance(latency, bool) or not isinstance(latency, int | float) or latency < 0:
            raise FaultError(f"latency must be a number of seconds >= 0, not {latency!r}")
        pool.latency = float(latency)
    if "armAnswerDelay" in data:
        delay = data["armAnswerDelay"]
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
            raise FaultError(f"armAnswerDelay must be a number of seconds >= 0, not {delay!r}")
        cloud.api.arm_answer_delay = float(delay)
    if "awsAnswerDelay" in data:
        delay = data["awsAnswerDelay"]
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
            raise FaultError(f"awsAnswerDelay must be a number of seconds >= 0, not {delay!r}")
        cloud.api.aws.answer_delay = float(delay)
    if "aks" in data:
        _aks_pool(twin, cloud.api, name, data["aks"])
    if "eks" in data:
        _eks_pool(twin, cloud.api, name, data["eks"])
    return {
        "pool": pool.name,
        "latency": pool.latency,
        "size": pool.size,
        "maxSize": pool.max_size,
        "vmssNodes": dict(cloud.api.vmss_nodes),
        "armAnswerDelay": cloud.api.arm_answer_delay,
        "awsInstances": dict(cloud.api.aws.instances),
        "eksUpdates": len(cloud.api.aws.updates),
        "instanceCalls": [list(c) for c in cloud.api.instance_calls],
    }


def _aks_pool(twin: Any, api: Any, pool: str, aks: Any) -> None:
    """Make the pool's nodes AKS VMSS VMs: providerID azure:///subscriptions/<s>/resourceGroups/
    <rg>/providers/Microsoft.Compute/virtualMachineScaleSets/<vmss>/virtualMachines/<i>."""
    if not isinstance(aks, dict) or set(aks) - {"subscription", "resourceGroup", "vmss"}:
        raise FaultError('aks must be {"subscription", "resourceGroup", "vmss"}')
    ids = [aks.get(k) for k in ("subscription", "resourceGroup", "vmss")]
    if not all(isinstance(v, str) and v and "/" not in v for v in ids):
        raise FaultError("aks subscription, resourceGroup and vmss must be non-empty names")
    sub, rg, vmss = ids
    nodes = [
        n
        for n in twin.store.list("nodes").items
        if ((n.get("metadata") or {}).get("labels") or {}).get("sickbay.dev/node-pool") == pool
    ]
    for i, node in enumerate(sorted(nodes, key=lambda n: n["metadata"]["name"])):
        name = node["metadata"]["name"]
        provider_id = (
            f"azure:///subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/"
            f"virtualMachineScaleSets/{vmss}/virtualMachines/{i}"
        )
        twin.store.mutate("nodes", name, lambda n, p=provider_id: n["spec"].update(providerID=p))
        api.vmss_nodes[f"{vmss}/{i}"] = name


def _eks_pool(twin: Any, api: Any, pool: str, eks: Any) -> None:
    """Make the pool's nodes EC2 instances of its managed node group's Auto Scaling group:
    providerID aws:///<zone>/i-<17 hex digits>."""
    if not isinstance(eks, dict) or set(eks) - {"zone"}:
        raise FaultError('eks must be {"zone": "<availability zone>"}')
    zone = eks.get("zone")
    if not isinstance(zone, str) or not re.fullmatch(r"[a-z0-9-]+", zone):
        raise FaultError("eks zone must be an availability zone name like us-twin-1a")
    nodes = [
        n
        for n in twin.store.list("nodes").items
        if ((n.get("metadata") or {}).get("labels") or {}).get("sickbay.dev/node-pool") == pool
    ]
    for i, node in enumerate(sorted(nodes, key=lambda n: n["metadata"]["name"])):
        name = node["metadata"]["name"]
        instance = f"i-{i:017x}"
        provider_id = f"aws:///{zone}/{instance}"
        twin.store.mutate("nodes", name, lambda n, p=provider_id: n["spec"].update(providerID=p))
        api.aws.instances[instance] = name
        api.aws.instance_pool[instance] = pool


def dispatch(
    twin: Any,
    method: str,
    parts: list[str],
    query: dict[str, str],
    body: bytes | dict[str, Any] | None,
) -> tuple[int, Any] | None:
    """Serve one `/twin/<parts>` request, or return None when the path is not ours."""
    if not parts or parts[0] not in PREFIXES:
        return None
    manager = _manager(twin)
    faults = manager.faults
    try:
        return _route(twin, manager, faults, method, parts, query, body)
    except FaultError as err:
        reason = "NotFound" if err.code == 404 else "BadRequest"
        raise errors.ApiError(err.code, reason, str(err)) from None
    except KeyError as err:
        raise errors.ApiError(404, "NotFound", str(err.args[0] if err.args else err)) from None
    except ValueError as err:
        raise errors.bad_request(str(err)) from None


def _route(
    twin: Any,
    manager: Any,
    faults: Any,
    method: str,
    parts: list[str],
    query: dict[str, str],
    body: bytes | dict[str, Any] | None,
) -> tuple[int, Any]:
    head, rest = parts[0], parts[1:]
    if head == "gpus" and method == "GET" and not rest:
        node = query.get("node")
        nodes = (
            [node] if node else [n["metadata"]["name"] for n in manager.store.list("nodes").items]
        )
        items: list[dict[str, Any]] = []
        for name in nodes:
            if node and manager.store.try_get("nodes", name) is None:
                raise FaultError(f'node "{name}" not found', 404)
            items.extend(_gpu_json(manager, g) for g in faults.gpus(name))
        return 200, {"items": items}
    if head == "faults":
        if method == "GET" and not rest:
            return 200, {"items": [f.to_json() for f in faults.faults()]}
        data = _body(body)
        if method == "POST" and not rest and "items" in data:
            return 201, {"items": [f.to_json() for f in faults.fail_many(_fault_batch(data))]}
        if method == "POST" and not rest:
            node = data.get("node")
            if not node:
                raise FaultError("node is required")
            made = faults.fail(
                str(node),
                data.get("gpu"),
                xid=_int(data, "xid"),
                degrade=data.get("degrade"),
                vanish=bool(data.get("vanish")),
                driver_taint=bool(data.get("driverTaint")),
            )
            return 201, {"items": [f.to_json() for f in made]}
        if method == "POST" and rest == ["recover"]:
            node = data.get("node")
            if not node:
                raise FaultError("node is required")
            done = faults.recover(str(node), data.get("gpu"))
            return 200, {"items": [f.to_json() for f in done]}
    if head == "known-faults" and not rest:
        if method == "GET":
            return 200, faults.known_faults()
        if method in ("PUT", "PATCH", "POST"):
            data = _body(body)
            unknown = set(data) - {"ignoreDeviceTaintRules", "expiredTolerationBug"}
            if unknown:
                raise FaultError(f"unknown known-fault switch(es): {', '.join(sorted(unknown))}")
            return 200, faults.set_known_faults(
                data.get("ignoreDeviceTaintRules"), data.get("expiredTolerationBug")
            )
    if head == "api-faults":
        api = faults.api
        if method == "GET" and not rest:
            return 200, {"items": api.rules(), "injected": api.injected}
        if method == "POST" and not rest:
            data = _body(body)
            if not data.get("kind"):
                raise FaultError("kind is required (500, 429, 409, timeout, reset or delay)")
            rule = api.add(
                kind=str(data["kind"]),
                verb=str(data.get("verb") or "*"),
                resource=str(data.get("resource") or "*"),
                rate=float(data.get("rate", 1.0)),
                count=_int(data, "count"),
                timeout_seconds=float(data.get("timeoutSeconds", 30.0)),
                match=str(data.get("match") or ""),
            )
            return 201, {
                "id": rule.id,
                "kind": rule.kind,
                "verb": rule.verb,
                "resource": rule.resource,
                "match": rule.match,
            }
        if method == "POST" and rest == ["drop-watches"]:
            return 200, {"dropped": faults.drop_watches()}
        if method == "POST" and rest == ["restart"]:
            data = _body(body)
            unknown = set(data) - {"downSeconds", "compact"}
            if unknown:
                raise FaultError(f"unknown restart setting(s): {', '.join(sorted(unknown))}")
            cut = faults.restart_api_server(
                float(data.get("downSeconds", 0.0)), bool(data.get("compact", True))
            )
            return 200, {"dropped": cut}
        if method == "DELETE" and len(rest) <= 1:
            rule_id = int(rest[0]) if rest else None
            removed = api.remove(rule_id)
            if rule_id is not None and not removed:
                raise FaultError(f"api fault rule {rule_id} not found", 404)
            return 200, {"removed": removed}
    if head == "alerts" and not rest and method in ("GET", "PUT"):
        alerts = manager.alerts
        if method == "PUT":
            data = _body(body)
            allowed = {"url", "token", "groupWait", "groupInterval", "repeatInterval"}
            unknown = set(data) - allowed
            if unknown:
                raise FaultError(f"unknown alert setting(s): {', '.join(sorted(unknown))}")
            config = alerts.config
            alerts.configure(
                dataclasses.replace(
                    config,
                    url=data.get("url", config.url),
                    token=data.get("token", config.token),
                    group_wait=float(data.get("groupWait", config.group_wait)),
                    group_interval=float(data.get("groupInterval", config.group_interval)),
                    repeat_interval=float(data.get("repeatInterval", config.repeat_interval)),
                )
            )
        return 200, {
            "active": alerts.active(),
            "sent": alerts.sent[-50:],
            "failures": alerts.failures,
            "receiver": alerts.config.url,  # the token is never shown
        }
    if head == "gpu-plugins" and method == "POST" and not rest:
        manager.gpu_plugins.install()
        return 200, {"installed": True}
    if head == "upgrades":
        return _upgrades(manager, method, rest, body)
    if head == "pools":
        pools = manager.node_pools
        if method == "GET" and not rest:
            return 200, {"items": [p.to_json() for p in pools.pools()]}
        if method == "POST" and len(rest) == 2 and rest[1] == "resize":
            data = _body(body)
            size = _int(data, "size")
            if size is None:
                raise FaultError("size is required")
            delay = data.get("delay")
            status = pools.resize(rest[0], size, None if delay is None else float(delay))
            return 200, status.to_json()
        if method == "PUT" and len(rest) == 2 and rest[1] == "cloud":
            return 200, _cloud_pool(twin, rest[0], _body(body))
        if method == "GET" and len(rest) == 2 and rest[1] == "cloud":
            cloud = (getattr(twin, "extensions", None) or {}).get("cloud")
            if cloud is None:
                raise FaultError("the twin serves no cloud API (twin up --no-cloud-api)", 404)
            return 200, {"instanceCalls": [list(c) for c in cloud.api.instance_calls]}
    raise errors.ApiError(
        405 if parts[0] in PREFIXES else 404,
        "MethodNotAllowed",
        f"{method} /twin/{'/'.join(parts)} is not supported",
    )


def _acting(
    what: str, node: str, data: dict[str, Any], allowed: set[str], call: Callable[[], Any]
) -> Any:
    """`call()` for one node of /twin/upgrades: settings other than `node` and `allowed`
    refused (400), an unknown node 404, a value the call refuses 400."""
    unknown = set(data) - {"node", *allowed}
    if unknown:
        raise FaultError(f"unknown {what} setting(s): {', '.join(sorted(unknown))}")
    try:
        return call()
    except KeyError:
        raise FaultError(f'node "{node}" not found', 404) from None
    except (TypeError, ValueError) as err:
        raise FaultError(str(err)) from None


def _upgrades(
    manager: Any, method: str, rest: list[str], body: bytes | dict[str, Any] | None
) -> tuple[int, Any]:
    plugins = manager.gpu_plugins
    if method == "GET" and not rest:
        return 200, {"items": [f.to_json() for f in plugins.faults()]}
    data = _body(body)
    node = str(data.get("node") or "")
    if (
        method == "POST"
        and rest
        in (
            [],
            ["recover"],
            ["rollout"],
            ["kubelet-restart"],
            ["plugin-restart"],
            ["reboot"],
            ["start-now"],
        )
        and not node
    ):
        raise FaultError("node is required")
    if method == "POST" and rest == ["kubelet-restart"]:
        _acting(
            "kubelet-restart",
            node,
            data,
            {"republishAfter"},
            lambda: plugins.restart_kubelet(
                node, republish_after=float(data.get("republishAfter", 5.0))
            ),
        )
        return 202, {"node": node}
    if method == "POST" and rest == ["start-now"]:
        _acting("start-now", node, data, set(), lambda: plugins.start_now(node))
        return 200, {"node": node}
    if method == "POST" and rest == ["reboot"]:
        _acting(
            "reboot",
            node,
            data,
            {"startsAfter"},
            lambda: plugins.reboot(node, starts_after=float(data.get("startsAfter", 60.0))),
        )
        return 202, {"node": node}
    if method == "POST" and rest == ["plugin-restart"]:
        _acting(
            "plugin-restart",
            node,
            data,
            {"startsAfter"},
            lambda: plugins.roll_plugin(node, starts_after=float(data.get("startsAfter", 10.0))),
        )
        return 202, {"node": node}
    if method == "POST" and rest == ["rollout"]:
        fault = _acting(
            "rollout",
            node,
            data,
            {"breaks", "healsOnRestart"},
            lambda: plugins.rollout(
                node,
                breaks=str(data.get("breaks") or "nvml"),
                heals_on_restart=bool(data.get("healsOnRestart", False)),
            ),
        )
        return 201, fault.to_json()
    if method == "POST" and not rest:
        fault = _acting(
            "upgrade",
            node,
            data,
            {"kubelet", "runtime", "breaks", "healsOnRestart"},
            lambda: plugins.upgrade(
                node,
                kubelet=data.get("kubelet"),
                runtime=data.get("runtime"),
                breaks=str(data.get("breaks") or "hook"),
                heals_on_restart=bool(data.get("healsOnRestart", True)),
            ),
        )
        return 201, fault.to_json()
    if method == "POST" and rest == ["recover"]:
        done = plugins.recover(node)
        return 200, {"items": [done.to_json()] if done else []}
    raise errors.ApiError(405, "MethodNotAllowed", f"{method} /twin/upgrades is not supported")


# --------------------------------------------------------------------------------------------
# Mounting on the twin's API server
# --------------------------------------------------------------------------------------------

_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def _verb(method: str, name: str | None, query: dict[str, str]) -> str:
    if method == "GET":
        if name:
            return "get"
        return "watch" if query.get("watch") in ("true", "1") else "list"
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return _VERBS.get(method, method.lower())


def install_server_hooks(twin: Any) -> bool:
    """Serve `/twin/...` fault routes and API fault injection on `twin.server`. True if done."""
    server: Any = getattr(twin, "server", None)
    httpd: Any = getattr(server, "httpd", None)
    base = getattr(httpd, "RequestHandlerClass", None)
    if base is None or not hasattr(server, "target"):
        return False
    if getattr(base, "_sickbay_faults", False):
        return True  # already installed
    if not all(hasattr(base, n) for n in ("_twin_endpoint", "_dispatch", "_send_json")):
        return False
    local = threading.local()

    class FaultHandler(base):  # type: ignore[misc, valid-type]
        _sickbay_faults = True

        def _dispatch(self, method: str, path: str, body: bytes) -> None:
            local.handler, local.method, self._sickbay_body = self, method, body
            try:
                super()._dispatch(method, path, body)
            finally:
                local.handler = None

        def _twin_endpoint(self, method: str, parts: list[str]) -> None:
            result = dispatch(twin, method, parts, self._query, getattr(self, "_sickbay_body", b""))
            if result is None:
                return super()._twin_endpoint(method, parts)
            self._send_json(*result)

    original_target = server.target

    def target(group: str, version: str, rest: list[str]) -> Any:
        tgt = original_target(group, version, rest)
        handler = getattr(local, "handler", None)
        api_faults = (getattr(twin, "extensions", None) or {}).get("api_faults")
        if handler is not None and api_faults is not None:
            verb = _verb(local.method, tgt.name, getattr(handler, "_query", {}))
            resource = tgt.rt.plural + (f"/{tgt.sub}" if tgt.sub else "")
            info = getattr(handler, "_info", None)
            if isinstance(info, dict):
                info.update(verb=verb, group=group, version=version, resource=resource)
            api_faults.intercept(handler, verb, resource, tgt.name)
        return tgt

    server.target = target
    httpd.RequestHandlerClass = FaultHandler
    return True


class FaultApiServer:
    """The same routes on a port of their own (for a server that cannot be hooked)."""

    def __init__(self, twin: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("fault api: " + format, *args)

            def _serve(self, method: str) -> None:
                split = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(split.query).items()}
                parts = [unquote(p) for p in split.path.split("/") if p]
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                token = getattr(twin, "token", None)
                try:
                    if token and self.headers.get("Authorization", "") != f"Bearer {token}":
                        raise errors.ApiError(401, "Unauthorized", "Unauthorized")
                    result = None
                    if parts[:1] == ["twin"]:
                        result = dispatch(twin, method, parts[1:], query, raw)
                    if result is None:
                        raise errors.ApiError(404, "NotFound", "404 page not found")
                    status, payload = result
                except errors.ApiError as err:
                    status, payload = err.code, err.to_status()
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def do_PATCH(self) -> None:
                self._serve("PATCH")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.host, self.port = host, self.httpd.server_address[1]
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="twin-faults", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FaultApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
