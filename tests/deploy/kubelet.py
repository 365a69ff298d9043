"""A kubelet for tests: runs a Pod read from the API as a local process (tests/deploy/podrun.py).

What a kubelet and container runtime give the container, and nothing else:

- the command: the container's `command` else the image's ENTRYPOINT, then `args` else the
  image's CMD (the image is this checkout: Dockerfile ENTRYPOINT/CMD/ENV/WORKDIR, its
  /opt/sickbay venv being this checkout's .venv);
- the environment: the image's ENV, then Service links: the `kubernetes` Service's always
  (KUBERNETES_SERVICE_HOST/PORT, ...), the pod namespace's Services' unless
  `enableServiceLinks: false`; then `envFrom`, then `env` (values, `$(VAR)` references,
  ConfigMap/Secret keys, the downward API), plus HOSTNAME and HOME;
- volumes, as the Pod lists them: ConfigMaps and Secrets (`items`, `defaultMode`, `optional`;
  kept current while the pod runs), emptyDirs (`sizeLimit`), projected volumes, among them the
  ServiceAccount volume the API's admission added (kube-api-access-*, mounted at SA_DIR): a
  token minted through TokenRequest, ca.crt from ConfigMap kube-root-ca.crt, the namespace;
  a volume kind or source it does not know fails the start (never skipped);
- the network: Service DNS names (<svc>.<ns>.svc.cluster.local, ...) resolve to ClusterIPs
  through /etc/hosts; a ClusterIP:port reaches the host process given as that Service's
  backend; container ports are reachable from the host (`Pod.port()`), for probes and for a
  Service's targetPort;
- the security context: runAsUser / runAsGroup / fsGroup, readOnlyRootFilesystem.

NetworkPolicies are not enforced (no network plugin); resources limits are not applied.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.deploy.bridge import Bridges
from tests.deploy.helpers import DOCKERFILE, ROOT

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# The projected token's lifetime as the kubelet asks for it (3607 s: an hour, and 7 s to tell
# kubelet-minted tokens apart).
TOKEN_SECONDS = 3607
IMAGE_PREFIX = "/opt/sickbay"  # the image's venv (Dockerfile), here this checkout's


class KubeletError(AssertionError):
    """The pod cannot start as written (a missing ConfigMap, an unknown volume kind...)."""


@dataclass
class Image:
    entrypoint: list[str]
    cmd: list[str]
    env: dict[str, str]
    workdir: str

    @classmethod
    def from_dockerfile(cls, path: Path = DOCKERFILE) -> Image:
        """The runtime stage (the last FROM) of the Dockerfile, /opt/sickbay mapped here."""
        text = re.sub(r"\\\n\s*", " ", path.read_text())
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
        last = max(i for i, ln in enumerate(lines) if ln.upper().startswith("FROM "))
        image = cls([], [], {"PATH": "/usr/local/bin:/usr/bin:/bin"}, "/")
        venv_bin = str(Path(sys.executable).parent)
        for line in lines[last + 1 :]:
            word, _, rest = line.partition(" ")
            word = word.upper()
            if word == "ENTRYPOINT":
                image.entrypoint = json.loads(rest)
            elif word == "CMD":
                image.cmd = json.loads(rest)
            elif word == "WORKDIR":
                image.workdir = rest.strip()
            elif word == "ENV":
                for pair in shlex.split(rest):
                    key, _, value = pair.partition("=")
                    value = value.replace("$PATH", image.env.get("PATH", ""))
                    image.env[key] = value.replace(f"{IMAGE_PREFIX}/bin", venv_bin)
        return image


def service_link_env(services: list[dict[str, Any]]) -> dict[str, str]:
    """The Docker-links-style variables a kubelet sets for each Service (enableServiceLinks)."""
    env: dict[str, str] = {}
    for svc in services:
        spec = svc["spec"]
        ip = spec.get("clusterIP")
        if not ip or ip == "None" or not spec.get("ports"):
            continue
        prefix = svc["metadata"]["name"].upper().replace("-", "_")
        first = spec["ports"][0]
        env[f"{prefix}_SERVICE_HOST"] = ip
        env[f"{prefix}_SERVICE_PORT"] = str(first["port"])
        for port in spec["ports"]:
            if port.get("name"):
                name = port["name"].upper().replace("-", "_")
                env[f"{prefix}_SERVICE_PORT_{name}"] = str(port["port"])
        proto = first.get("protocol", "TCP").lower()
        env[f"{prefix}_PORT"] = f"{proto}://{ip}:{first['port']}"
        for port in spec["ports"]:
            proto = port.get("protocol", "TCP")
            base = f"{prefix}_PORT_{port['port']}_{proto}"
            env[base] = f"{proto.lower()}://{ip}:{port['port']}"
            env[f"{base}_PROTO"] = proto.lower()
            env[f"{base}_PORT"] = str(port["port"])
            env[f"{base}_ADDR"] = ip
    return env


@dataclass
class Api:
    """The cluster as the kubelet reads it: an admin client of the API (JSON dicts)."""

    url: str
    token: str
    ca_file: str

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.token}"},
            verify=ssl.create_default_context(cafile=self.ca_file),
            timeout=30,
        )

    def get(self, path: str, missing_ok: bool = False) -> dict[str, Any] | None:
        with self.client() as c:
            answer = c.get(path)
        if answer.status_code == 404 and missing_ok:
            return None
        assert answer.status_code == 200, f"GET {path}: {answer.status_code} {answer.text}"
        return dict(answer.json())

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.client() as c:
            answer = c.post(path, json=body)
        assert answer.status_code in (200, 201), f"POST {path}: {answer.text}"
        return dict(answer.json())


@dataclass
class Backend:
    """Where a Service's ClusterIP:port leads on the host."""

    namespace: str
    service: str
    host: str
    port: int


@dataclass
class Pod:
    name: str
    container: str
    process: subprocess.Popen[bytes]
    log: Path
    ports: dict[int, int]  # containerPort -> host 127.0.0.1 port
    spec: dict[str, Any]
    env: dict[str, str]
    files: dict[str, list[str]] = field(default_factory=dict)  # mount path -> file names

    def port(self, name_or_number: str | int) -> int:
        """The host port reaching the container's port (named or numbered, as a probe says)."""
        container = next(c for c in self.spec["containers"] if c["name"] == self.container)
        number = name_or_number
        if isinstance(name_or_number, str) and not name_or_number.isdigit():
            named = {p["name"]: p["containerPort"] for p in container.get("ports") or []}
            if name_or_number not in named:
                raise KubeletError(f"container {self.container} has no port named {number!r}")
            number = named[name_or_number]
        return self.ports[int(number)]

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float) -> int:
        if self.process.poll() is None:
            self.process.terminate()  # what a pod deletion sends first
            try:
                return self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(timeout=10)


class Kubelet:
    """Starts pods (one container each) read from `api`; `stop()` ends them all."""

    def __init__(self, api: Api, ca_pem: bytes, backends: list[Backend], directory: Path) -> None:
        if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
            raise KubeletError("the test kubelet needs root, unshare(1) and ip(8)")
        self.api = api
        self.ca_pem = ca_pem
        self.backends = backends
        # Unix socket paths are short (108 bytes): a directory of its own under /tmp.
        self.dir = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))
        self.logs = directory
        self.bridges = Bridges()
        self.pods: list[Pod] = []
        self.image = Image.from_dockerfile()
        self._routes: list[dict[str, Any]] = []
        self._specs: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        self._synced: dict[str, str] = {}
        self._stopping = threading.Event()
        self._sync_thread: threading.Thread | None = None
        self._hosts: list[str] = []
        self._addresses: list[str] = []
        for n, backend in enumerate(backends):
            svc = self.api.get(f"/api/v1/namespaces/{backend.namespace}/services/{backend.service}")
            assert svc is not None
            ip = svc["spec"]["clusterIP"]
            name, ns = backend.service, backend.namespace
            self._hosts.append(f"{ip}\t{name}.{ns}.svc.cluster.local {name}.{ns}.svc {name}.{ns}\n")
            self._addresses.append(ip)
            for port in svc["spec"]["ports"]:
                sock = f"out-{n}-{port['port']}.sock"
                self.bridges.out_of(str(self.dir / sock), backend.host, backend.port)
                self._routes.append({"host": ip, "port": port["port"], "socket": sock})

    # ---- reading the pod's world ---------------------------------------------------------

    def _object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.api.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}", missing_ok=True)

    def _key(
        self, kind: str, namespace: str, ref: dict[str, Any], what: str
    ) -> tuple[bool, bytes | None]:
        """(found, value) of a ConfigMap / Secret key reference."""
        obj = self._object(kind, namespace, ref["name"])
        if obj is None:
            if ref.get("optional"):
                return False, None
            raise KubeletError(f'{what}: {kind[:-1]} "{ref["name"]}" not found')
        data = _data(kind, obj)
        if ref.get("key") is not None and ref["key"] not in data:
            if ref.get("optional"):
                return False, None
            raise KubeletError(f"{what}: key {ref['key']} not found in {ref['name']}")
        return True, data.get(ref.get("key", ""))

    def environment(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        ns = pod["metadata"]["namespace"]
        env = dict(self.image.env)
        env["HOSTNAME"] = pod["metadata"]["name"]
        env["HOME"] = self.image.workdir
        kubernetes = self.api.get("/api/v1/namespaces/default/services/kubernetes")
        assert kubernetes is not None
        if pod["spec"].get("enableServiceLinks", True):
            listed = self.api.get(f"/api/v1/namespaces/{ns}/services") or {"items": []}
            env.update(service_link_env(listed["items"]))
        env.update(service_link_env([kubernetes]))  # the master service: always
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            for kind, key in (("configmaps", "configMapRef"), ("secrets", "secretRef")):
                if key in source:
                    ref = source[key]
                    obj = self._object(kind, ns, ref["name"])
                    if obj is None:
                        if ref.get("optional"):
                            continue
                        raise KubeletError(f'envFrom: {kind[:-1]} "{ref["name"]}" not found')
                    for k, v in _data(kind, obj).items():
                        env[prefix + k] = v.decode()
        for entry in container.get("env") or []:
            if "value" in entry or "valueFrom" not in entry:
                env[entry["name"]] = _expand(entry.get("value", ""), env)
                continue
            source = entry["valueFrom"]
            if "configMapKeyRef" in source or "secretKeyRef" in source:
                kind = "configmaps" if "configMapKeyRef" in source else "secrets"
                ref = source.get("configMapKeyRef") or source["secretKeyRef"]
                found, value = self._key(kind, ns, ref, f"env {entry['name']}")
                if found and value is not None:
                    env[entry["name"]] = value.decode()
            elif "fieldRef" in source:
                env[entry["name"]] = _field(pod, source["fieldRef"]["fieldPath"])
            else:
                raise KubeletError(f"env {entry['name']}: unsupported source {sorted(source)}")
        return env

    def volumes(
        self, pod: dict[str, Any], container: dict[str, Any], synced_only: bool = False
    ) -> list[dict[str, Any]]:
        """The container's volumes as podrun mounts them. `synced_only`: just the ConfigMap
        and Secret volumes, which the kubelet keeps current while the pod runs."""
        ns = pod["metadata"]["namespace"]
        spec = pod["spec"]
        security = spec.get("securityContext") or {}
        gid = int(security.get("fsGroup", 0))
        by_name = {v["name"]: v for v in spec.get("volumes") or []}
        mounts = list(container.get("volumeMounts") or [])
        out = []
        for mount in mounts:
            volume = by_name.get(mount["name"])
            if volume is None:
                raise KubeletError(f"volumeMount {mount['name']}: no such volume")
            if mount.get("subPath"):
                raise KubeletError(f"volumeMount {mount['name']}: subPath is not modelled")
            files: dict[str, tuple[bytes, int]] = {}
            mode, size = 0o755, None
            synced = "configMap" in volume or "secret" in volume
            if synced_only and not synced:
                continue
            if synced:
                kind = "configmaps" if "configMap" in volume else "secrets"
                source = volume.get("configMap") or volume["secret"]
                name = source.get("name") or source.get("secretName")
                obj = self._object(kind, ns, name)
                default = int(source.get("defaultMode", 0o644))
                if obj is None:
                    if not source.get("optional"):
                        raise KubeletError(
                            f'MountVolume.SetUp failed for volume "{volume["name"]}": '
                            f'{kind[:-1]} "{name}" not found'
                        )
                else:
                    data = _data(kind, obj)
                    items = source.get("items")
                    if items is None:
                        items = [{"key": k, "path": k} for k in data]
                    for item in items:
                        if item["key"] not in data:
                            raise KubeletError(
                                f"volume {volume['name']}: key {item['key']} not in {name}"
                            )
                        files[item["path"]] = (data[item["key"]], int(item.get("mode", default)))
            elif "emptyDir" in volume:
                mode = 0o777
                size = _tmpfs_size((volume["emptyDir"] or {}).get("sizeLimit"))
            elif "projected" in volume:
                files = self._projected(pod, volume["projected"])
            else:
                kinds = sorted(set(volume) - {"name"})
                raise KubeletError(f"volume {volume['name']}: kind {kinds} is not modelled")
            out.append(
                {
                    "path": mount["mountPath"],
                    "readOnly": bool(mount.get("readOnly")),
                    "mode": mode,
                    "size": size,
                    "gid": gid,
                    "files": {k: [base64.b64encode(v).decode(), m] for k, (v, m) in files.items()},
                }
            )
        return out

    def _projected(
        self, pod: dict[str, Any], projected: dict[str, Any]
    ) -> dict[str, tuple[bytes, int]]:
        """A projected volume: ServiceAccount token (TokenRequest), ConfigMap and Secret
        items, downward API fields (the admission plugin's kube-api-access-* volume)."""
        ns = pod["metadata"]["namespace"]
        default = int(projected.get("defaultMode", 0o644))
        gid = (pod["spec"].get("securityContext") or {}).get("fsGroup")
        # The kubelet makes the token readable by fsGroup only (0600 without one).
        token_mode = 0o640 if gid is not None else 0o600
        files: dict[str, tuple[bytes, int]] = {}
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source:
                spec: dict[str, Any] = {
                    "expirationSeconds": source["serviceAccountToken"].get(
                        "expirationSeconds", TOKEN_SECONDS
                    )
                }
                if source["serviceAccountToken"].get("audience"):
                    spec["audiences"] = [source["serviceAccountToken"]["audience"]]
                account = pod["spec"].get("serviceAccountName") or "default"
                token = self.api.post(
                    f"/api/v1/namespaces/{ns}/serviceaccounts/{account}/token",
                    {
                        "apiVersion": "authentication.k8s.io/v1",
                        "kind": "TokenRequest",
                        "spec": spec,
                    },
                )["status"]["token"]
                files[source["serviceAccountToken"]["path"]] = (token.encode(), token_mode)
            elif "configMap" in source or "secret" in source:
                kind = "configmaps" if "configMap" in source else "secrets"
                ref = source.get("configMap") or source["secret"]
                obj = self._object(kind, ns, ref["name"])
                if obj is None:
                    if ref.get("optional"):
                        continue
                    raise KubeletError(
                        f'MountVolume.SetUp failed for projected volume: {kind[:-1]} "{ref["name"]}" not found'
                    )
                data = _data(kind, obj)
                for item in ref.get("items") or [{"key": k, "path": k} for k in data]:
                    files[item["path"]] = (data[item["key"]], int(item.get("mode", default)))
            elif "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    value = _field(pod, item["fieldRef"]["fieldPath"])
                    files[item["path"]] = (value.encode(), int(item.get("mode", default)))
            else:
                raise KubeletError(f"projected source {sorted(source)} is not modelled")
        return files

    # ---- running it ------------------------------------------------------------------------

    def start(self, pod: dict[str, Any], container_name: str | None = None) -> Pod:
        spec = pod["spec"]
        container = (
            spec["containers"][0]
            if container_name is None
            else next(c for c in spec["containers"] if c["name"] == container_name)
        )
        security = {
            **(spec.get("securityContext") or {}),
            **(container.get("securityContext") or {}),
        }
        if security.get("runAsNonRoot") and not security.get("runAsUser"):
            raise KubeletError("runAsNonRoot without runAsUser: the image's user is not modelled")
        uid = int(security.get("runAsUser", 0))
        gid = int(security.get("runAsGroup", 0))
        fs_group = (spec.get("securityContext") or {}).get("fsGroup")
        env = self.environment(pod, container)
        # `command` replaces the image's ENTRYPOINT and drops its CMD; `args` alone replace CMD.
        if container.get("command"):
            raw = [*container["command"], *(container.get("args") or [])]
        else:
            cmd = container["args"] if "args" in container else self.image.cmd
            raw = [*self.image.entrypoint, *cmd]
        argv = [_expand(a, env) for a in raw]
        program = shutil.which(argv[0], path=env.get("PATH"))
        if program is None:
            raise KubeletError(f'exec: "{argv[0]}": executable file not found in $PATH')
        argv[0] = program
        volumes = self.volumes(pod, container)
        name = pod["metadata"]["name"]
        inbound, ports = [], {}
        for port in container.get("ports") or []:
            sock = f"in-{name}-{port['containerPort']}.sock"
            inbound.append({"port": port["containerPort"], "socket": sock})
            ports[port["containerPort"]] = self.bridges.into(str(self.dir / sock))
        plan = {
            "argv": argv,
            "env": env,
            "cwd": self.image.workdir,
            "uid": uid,
            "gid": gid,
            "groups": [int(fs_group)] if fs_group is not None else [],
            "staging": str(self.dir / f"staging-{name}"),
            "socket_dir": str(self.dir),
            "addresses": self._addresses,
            "outbound": self._routes,
            "inbound": inbound,
            "volumes": volumes,
            "name": name,
            "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost\n" + "".join(self._hosts),
            "readOnlyRoot": bool(security.get("readOnlyRootFilesystem")),
            "traverse": _closed_ancestors([sys.base_prefix, sys.prefix, str(ROOT)]),
            # What stands in for the image's files: the interpreter, the venv, the source.
            "image": sorted({sys.base_prefix, sys.prefix, str(ROOT)}),
        }
        (self.dir / f"staging-{name}").mkdir()
        plan_file = self.dir / f"{name}.json"
        plan_file.write_text(json.dumps(plan))
        plan_file.chmod(0o600)  # it holds the pod's token
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    "unshare",
                    "--mount",
                    "--net",
                    "--propagation",
                    "private",
                    "--",
                    sys.executable,
                    "-m",
                    "tests.deploy.podrun",
                    str(plan_file),
                ],
                cwd=ROOT,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT)},
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_pdeathsig(),
            )
        started = Pod(
            name,
            container["name"],
            process,
            log,
            ports,
            spec,
            env,
            {v["path"]: sorted(v["files"]) for v in volumes},
        )
        self.pods.append(started)
        self._specs[name] = (pod, container)
        self._synced[name] = self._sync_payload(pod, container)
        if self._sync_thread is None:
            self._sync_thread = threading.Thread(target=self._sync_loop, daemon=True)
            self._sync_thread.start()
        return started

    def _sync_payload(self, pod: dict[str, Any], container: dict[str, Any]) -> str:
        return json.dumps(self.volumes(pod, container, synced_only=True), sort_keys=True)

    def _sync_loop(self) -> None:
        """The kubelet's volume manager: a ConfigMap or Secret that changes (or appears, when
        optional) reaches the running container's volume. A real kubelet takes up to its
        sync period plus the cache's TTL (about a minute); this one looks every second.
        podrun applies `<pod>.volumes.json` when it changes."""
        while not self._stopping.wait(1.0):
            for name, (pod, container) in list(self._specs.items()):
                try:
                    payload = self._sync_payload(pod, container)
                except (KubeletError, AssertionError, httpx.HTTPError):
                    continue  # a kubelet keeps the last content when the API fails
                if payload != self._synced.get(name):
                    self._synced[name] = payload
                    temp = self.dir / f".{name}.volumes.json"
                    temp.write_text(payload)
                    temp.rename(self.dir / f"{name}.volumes.json")

    def stop(self, timeout: float = 45.0) -> None:
        self._stopping.set()
        if self._sync_thread is not None:
            self._sync_thread.join(timeout=10)
        for pod in self.pods:
            pod.stop(timeout)
        self.bridges.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _pdeathsig() -> Callable[[], None]:
    from harness.stack import _pdeathsig as pdeathsig

    return pdeathsig()


def _data(kind: str, obj: dict[str, Any]) -> dict[str, bytes]:
    if kind == "secrets":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    out = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return out


def _expand(value: str, env: dict[str, str]) -> str:
    """$(VAR) references, as the kubelet expands them in env values, command and args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), value)


def _field(pod: dict[str, Any], path: str) -> str:
    fields = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "metadata.uid": pod["metadata"].get("uid", ""),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": (pod.get("status") or {}).get("podIP", ""),
    }
    if path not in fields:
        raise KubeletError(f"fieldRef {path} is not modelled")
    return str(fields[path])


def _tmpfs_size(limit: str | None) -> str | None:
    if not limit:
        return None
    units = {"Ki": "k", "Mi": "m", "Gi": "g"}
    for suffix, unit in units.items():
        if limit.endswith(suffix):
            return limit[: -len(suffix)] + unit
    return limit


def _closed_ancestors(paths: list[str]) -> list[str]:
    """Directories on the way to `paths` that others may not enter (a 0700 home)."""
    out: list[str] = []
    for path in paths:
        p = Path(path).resolve()
        for parent in [*reversed(p.parents), p]:
            if not os.stat(parent).st_mode & 0o001 and str(parent) not in out:
                out.append(str(parent))
    return out
