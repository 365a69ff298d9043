"""Run one container of a pod the way a kubelet would, as a local process (root, Linux).

    unshare --mount --net --propagation private -- python -m tests.deploy.podrun PLAN.json

Started in private mount and network namespaces, it prepares what a container runtime gives
a container, then runs the container's command as the pod's user and relays its exit:

- network: loopback only, up, plus every ClusterIP the plan routes (Services: the Kubernetes
  API, Temporal); each routed ClusterIP:port is bridged over a Unix socket to the host process
  behind it (tests/deploy/bridge.py); each container port is reachable from the host through
  a Unix socket too (probes, the webhook's Service);
- files: each volume (ConfigMap, Secret, projected ServiceAccount token, emptyDir) is a tmpfs
  at its mount path holding exactly the plan's files (mode, group fsGroup), read-only when
  the mount says so, and kept current when the kubelet sends new content (an optional
  ConfigMap that appears later, an edited one); /etc/hosts resolves the Services' DNS names to their ClusterIPs (the
  cluster DNS); new directories (/etc/sickbay, /var/run/secrets, the image's WORKDIR) appear
  through overlays that only this process tree sees; the host is never changed;
- `readOnlyRootFilesystem`: every other mount is remounted read-only;
- the command runs with the plan's uid, gid and groups (runAsUser / runAsGroup / fsGroup),
  its environment exactly the plan's, its working directory the image's WORKDIR; SIGTERM is
  passed on (a pod deletion), and this process exits as the container did.
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, check=False)
    if done.returncode:  # say what the tool said: the pod's log is where a test shows it
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.decode(errors='replace').strip()}")


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _existing_ancestor(path: str) -> Path:
    p = Path(path)
    while not p.exists():
        p = p.parent
    return p.resolve()


def _overlay(target: Path, staging: Path, n: int) -> None:
    upper, work = staging / f"ov{n}" / "upper", staging / f"ov{n}" / "work"
    upper.mkdir(parents=True)
    work.mkdir(parents=True)
    _run(
        "mount",
        "-t",
        "overlay",
        "overlay",
        "-o",
        f"lowerdir={target},upperdir={upper},workdir={work}",
        str(target),
    )


def _prepare_files(plan: dict[str, Any]) -> None:
    staging = Path(plan["staging"])
    _run("mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(staging))
    overlaid: list[Path] = []

    def overlay(target: Path) -> None:
        if any(target == o or o in target.parents for o in overlaid):
            return
        _overlay(target, staging, len(overlaid))
        overlaid.append(target)

    overlay(Path("/etc"))  # /etc/hosts: the cluster DNS
    for directory in plan["traverse"]:  # e.g. a 0700 home holding the interpreter
        overlay(Path(directory))
        os.chmod(directory, os.stat(directory).st_mode | 0o711)
    wanted = [v["path"] for v in plan["volumes"]] + [plan["cwd"]]
    for path in wanted:
        if not Path(path).exists():
            overlay(_existing_ancestor(path))
    Path("/etc/hosts").write_text(plan["hosts"])
    os.makedirs(plan["cwd"], exist_ok=True)
    os.chown(plan["cwd"], plan["uid"], plan["gid"])
    # The image's files stand in a checkout that may lie under a volume's mount path (a
    # clone in /tmp, and the pod's /tmp emptyDir): in a real image they never do. Held by
    # fds now, they are bound back in place over the volume once it is mounted.
    image = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in plan.get("image", [])}
    for volume in sorted(plan["volumes"], key=lambda v: v["path"].count("/")):
        path = volume["path"]
        os.makedirs(path, exist_ok=True)
        options = f"mode={volume['mode']:o}"
        if volume.get("size"):
            options += f",size={volume['size']}"
        _run("mount", "-t", "tmpfs", "-o", options, "tmpfs", path)
        os.chown(path, 0, volume["gid"])
        _write_volume(volume)
        for hidden, fd in image.items():
            if Path(path) in Path(hidden).parents:
                os.makedirs(hidden, mode=0o755, exist_ok=True)
                # Not canonicalized: the kernel follows the fd's link to the real directory
                # (mount(8) would resolve the path, now the volume's own empty directory).
                _run("mount", "--no-canonicalize", "--bind", f"/proc/{os.getpid()}/fd/{fd}", hidden)
        if volume["readOnly"]:
            _run("mount", "-o", "remount,bind,ro", path)


def _write_volume(volume: dict[str, Any]) -> None:
    """The volume's files exactly (others removed), as the kubelet's atomic writer leaves it."""
    path = Path(volume["path"])
    for old in path.iterdir():
        if old.name not in volume["files"]:
            old.unlink()
    for name, (data, mode) in volume["files"].items():
        file = path / name
        file.parent.mkdir(parents=True, exist_ok=True)
        temp = file.with_name(f".{file.name}.tmp")
        temp.write_bytes(base64.b64decode(data))
        os.chown(temp, 0, volume["gid"])
        os.chmod(temp, mode)
        temp.rename(file)


async def _sync_volumes(plan: dict[str, Any], updates: str) -> None:
    """Apply the kubelet's new content of ConfigMap / Secret volumes (`<pod>.volumes.json`)."""
    seen = 0.0
    while True:
        await asyncio.sleep(0.5)  # poll interval for the kubelet's volume updates
        try:
            stamp = os.stat(updates).st_mtime
        except FileNotFoundError:
            continue
        if stamp == seen:
            continue
        seen = stamp
        _apply(updates)


def _apply(updates: str) -> None:
    for volume in json.loads(Path(updates).read_text()):
        if volume["readOnly"]:
            _run("mount", "-o", "remount,bind,rw", volume["path"])
        try:
            _write_volume(volume)
        finally:
            if volume["readOnly"]:
                _run("mount", "-o", "remount,bind,ro", volume["path"])


def _read_only_root(plan: dict[str, Any]) -> None:
    keep = {v["path"] for v in plan["volumes"]}  # each volume is as its mount says
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point = line.split()[4].replace("\\040", " ")
        if mount_point in keep or mount_point.startswith(("/proc", "/sys", "/dev")):
            continue
        # Some mounts (locked by the outer namespace) refuse: they stay as they are.
        subprocess.run(
            ["mount", "-o", "remount,bind,ro", mount_point], capture_output=True, check=False
        )


async def _main(plan: dict[str, Any]) -> int:
    from tests.deploy.bridge import listen_tcp, listen_unix, tcp, unix

    sockets = os.open(plan["socket_dir"], os.O_PATH | os.O_DIRECTORY)
    _run("ip", "link", "set", "lo", "up")
    for address in plan["addresses"]:
        _run("ip", "addr", "add", f"{address}/32", "dev", "lo")
    _prepare_files(plan)
    servers = []
    # The socket directory may now be hidden under the /tmp emptyDir: reach it by its fd.
    via = f"/proc/self/fd/{sockets}"
    for route in plan["outbound"]:
        servers.append(
            await listen_tcp(route["host"], route["port"], unix(f"{via}/{route['socket']}"))
        )
    for route in plan["inbound"]:
        servers.append(
            await listen_unix(f"{via}/{route['socket']}", tcp("127.0.0.1", route["port"]))
        )
    if plan["readOnlyRoot"]:
        _read_only_root(plan)
    child = await asyncio.create_subprocess_exec(
        *plan["argv"],
        env=plan["env"],
        cwd=plan["cwd"],
        user=plan["uid"],
        group=plan["gid"],
        extra_groups=plan["groups"],
        preexec_fn=_die_with_parent,
    )
    syncing = asyncio.create_task(_sync_volumes(plan, f"{via}/{plan['name']}.volumes.json"))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, child.send_signal, sig)
    code = await child.wait()
    syncing.cancel()
    for server in servers:
        server.close()
    return code if code >= 0 else 128 - code


def main() -> None:
    _die_with_parent()
    plan = json.loads(Path(sys.argv[1]).read_text())
    sys.exit(asyncio.run(_main(plan)))


if __name__ == "__main__":
    main()
