"""The Sickbay image, built from ./Dockerfile by the Docker engine (marker `docker`).

Cases:
- the image builds from the repository;
- `docker run IMAGE --help` runs the `sickbay` entrypoint and lists the worker and webhook;
- it runs as uid 10001 (non-root), with no write access to the installed package;
- its HEALTHCHECK is recorded in the image config;
- the installed runbooks load inside the image (`sickbay runbooks validate`, if built).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.containers.conftest import ROOT

pytestmark = pytest.mark.docker

TAG = "sickbay:containers-test"


@pytest.fixture(scope="module")
def image(docker_engine: None) -> Iterator[Any]:
    import docker

    client = docker.from_env()
    built, _logs = client.images.build(path=str(ROOT), tag=TAG, rm=True, pull=False)
    try:
        yield built
    finally:
        client.images.remove(TAG, force=True)
        client.close()


def _run(args: list[str], entrypoint: list[str] | None = None) -> str:
    import docker

    client = docker.from_env()
    try:
        out = client.containers.run(
            TAG, args, entrypoint=entrypoint, remove=True, stdout=True, stderr=True
        )
    finally:
        client.close()
    return out.decode()


def test_help_runs_the_console_script(image: Any) -> None:
    out = _run(["--help"])
    assert "usage: sickbay" in out
    assert "webhook" in out


def test_runs_as_non_root(image: Any) -> None:
    assert image.attrs["Config"]["User"].split(":")[0] == "10001"
    assert _run(["-c", "import os; print(os.getuid())"], entrypoint=["python"]).strip() == "10001"
    probe = "import os, worker; print(os.access(os.path.dirname(worker.__file__), os.W_OK))"
    assert _run(["-c", probe], entrypoint=["python"]).strip() == "False"


def test_healthcheck_in_image_config(image: Any) -> None:
    check = image.attrs["Config"]["Healthcheck"]["Test"]
    assert check[0] == "CMD" and "SICKBAY_HEALTHCHECK_URL" in " ".join(check)


def test_packaged_runbooks_load_in_the_image(image: Any) -> None:
    probe = (
        "from activities.runbooks import load_dir; from worker.settings import Settings; "
        "print(len(load_dir(Settings().runbooks_dir).runbooks))"
    )
    shipped = len(list((ROOT / "runbooks").glob("*.yaml")))
    assert _run(["-c", probe], entrypoint=["python"]).strip() == str(shipped)
