"""The real kubectl binary against the cluster twin.

- `twin`: one twin per module (profile 1.36, two GPU nodes, every controller, time 10x), served
  without a token, the way `sickbay-dev up` serves it (kubectl never sends a bearer token over
  plain HTTP, so a token-protected twin would answer it 401).
- `ns`: a fresh namespace.
- `kubectl(*args, stdin=None, ok=True)`: runs kubectl with that twin's kubeconfig, an isolated
  HOME (discovery cache) and a bounded timeout; returns the CompletedProcess and, with
  `ok=True`, fails the test with kubectl's stderr when it exits non-zero.

kubectl comes from the machine (`apt-get install kubectl`). Without it the module skips with
that hint; SICKBAY_REQUIRE_KUBECTL=1 (set by .ci/run) turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from twin.clock import Clock
from twin.controllers.manager import ControllerManager, TwinOptions
from twin.runtime import Twin

REQUIRE_ENV = "SICKBAY_REQUIRE_KUBECTL"
KUBECTL_TIMEOUT = 120.0  # seconds; a generous bound for a busy 2-core machine

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def kubectl_binary() -> str | None:
    return shutil.which("kubectl")


MIN_MINOR = 28  # `kubectl auth whoami` (SelfSubjectReview) is GA from 1.28


def _client_minor(path: str) -> int | None:
    done = subprocess.run(
        [path, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=60
    )
    try:
        minor = json.loads(done.stdout)["clientVersion"]["minor"]
        return int("".join(ch for ch in minor if ch.isdigit()))
    except (ValueError, KeyError, TypeError):
        return None


@pytest.fixture(scope="module")
def kubectl_path() -> str:
    found = kubectl_binary()
    reason = ""
    if found is None:
        reason = "kubectl is not installed: apt-get install kubectl"
    else:
        minor = _client_minor(found)
        if minor is None or minor < MIN_MINOR:
            reason = f"kubectl at {found} is older than v1.{MIN_MINOR}: apt-get install kubectl"
    if reason:
        if os.environ.get(REQUIRE_ENV, "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{REQUIRE_ENV} is set but {reason}")
        pytest.skip(reason)
    assert found is not None
    return found


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Twin]:
    twin = Twin(profile="1.36", clock=Clock(time_scale=10.0))
    twin.seed(nodes=2, gpus_per_node=2)
    twin.add_controller(ControllerManager(TwinOptions()))
    twin.start()
    try:
        yield twin
    finally:
        twin.stop()


@pytest.fixture
def ns(twin: Twin) -> str:
    """A fresh namespace (made in the store: protobuf creation has its own test)."""
    name = f"k-{uuid.uuid4().hex[:8]}"
    twin.store.create("namespaces", {"metadata": {"name": name}})
    return name


@pytest.fixture(scope="module")
def kubectl(kubectl_path: str, twin: Twin, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    home = tmp_path_factory.mktemp("kubectl-home")
    config = twin.write_kubeconfig(Path(home) / "kubeconfig")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "KUBECONFIG": str(config),
        "KUBECTL_INTERACTIVE_DELETE": "false",
    }

    def run(
        *args: str, stdin: str | None = None, ok: bool = True, timeout: float = KUBECTL_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [kubectl_path, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
        if ok and done.returncode != 0:
            pytest.fail(
                f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}"
            )
        return done

    run.argv = [kubectl_path]  # type: ignore[attr-defined]
    run.env = env  # type: ignore[attr-defined]
    return run
