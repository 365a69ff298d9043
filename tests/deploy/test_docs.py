"""docs/deploy.md, held to the code: its examples are run through the same loaders.

Cases:
- the channels.yaml example loads with the worker's channel loader and defines every channel
  the shipped runbooks escalate to;
- every SICKBAY_* name the docs mention is read by the code;
- the compose services and deploy/ files the docs list exist;
- the RBAC table lists every rule of deploy/rbac*.yaml (base and optional roles) with its verbs;
- the sizing table's defaults are the settings' defaults, and the ConfigMap's where it sets them.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.deploy.helpers import DEPLOY, ROOT, assert_known_env

DOCS = ROOT / "docs" / "deploy.md"
TEXT = DOCS.read_text()


def _heredoc(name: str) -> str:
    match = re.search(rf"cat > {re.escape(name)} <<'EOF'\n(.*?)\nEOF\n", TEXT, re.S)
    assert match, f"docs/deploy.md has no `cat > {name} <<'EOF'` example"
    return match.group(1)


def test_channels_example_loads_and_covers_the_shipped_runbooks(tmp_path: Path) -> None:
    from activities.notify.config import ChannelsConfig
    from activities.runbooks import load_dir

    path = tmp_path / "channels.yaml"
    path.write_text(_heredoc("channels.yaml"))
    config = ChannelsConfig.load(path)
    defined = set(yaml.safe_load(path.read_text())["channels"])
    used = {
        channel
        for runbook in load_dir(ROOT / "runbooks").runbooks
        for channel in runbook.spec.escalation.channels
    }
    assert used <= defined, f"runbooks escalate to {sorted(used - defined)}, not in the example"
    assert config is not None


def test_every_sickbay_name_in_the_docs_is_read_by_the_code() -> None:
    names = set(re.findall(r"\bSICKBAY_[A-Z0-9_]+\b", TEXT))
    # Compose-level variables (host ports, host paths, image tag) are read by docker compose,
    # not by Sickbay; they must appear in docker-compose.yml instead.
    compose = (ROOT / "docker-compose.yml").read_text()
    compose_only = {n for n in names if f"${{{n}" in compose}
    assert_known_env(names - compose_only, "docs/deploy.md")


def test_files_the_docs_list_exist() -> None:
    for name in re.findall(r"`deploy/([\w./-]+)`", TEXT):
        assert (DEPLOY / name).exists(), f"docs/deploy.md mentions deploy/{name}"
    for name in re.findall(r"^\| `([a-z-]+\.yaml)`", TEXT, re.M):
        assert (DEPLOY / name).exists(), f"docs/deploy.md lists {name}"


def test_rbac_table_matches_the_role() -> None:
    """docs/deploy.md's "What the RBAC grants" table lists each rule of deploy/rbac*.yaml with
    exactly its verbs (update the table when a role changes)."""
    rules = [
        rule
        for path in sorted(DEPLOY.glob("rbac*.yaml"))
        for d in yaml.safe_load_all(path.read_text())
        if d["kind"] == "ClusterRole"
        for rule in d["rules"]
    ]
    rows = [line for line in TEXT.splitlines() if line.startswith("| ")]
    for rule in rules:
        group = rule["apiGroups"][0] or "core"
        verbs = ", ".join(rule["verbs"])
        for resource in rule["resources"]:
            matching = [
                r
                for r in rows
                if r.startswith(f"| {group} |") and resource in r and f"| {verbs} |" in r
            ]
            assert matching, f"docs/deploy.md's RBAC table lacks {group} {resource}: {verbs}"


def test_sizing_table_gives_the_defaults_the_worker_runs_with() -> None:
    from worker.settings import Settings

    section = TEXT.split("### Sizing the workers", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| [^|]+ \| `SICKBAY_([A-Z_]+)` \| (\d+) \|$", section, re.M)
    assert len(rows) == 5, rows
    config = next(
        doc
        for doc in yaml.safe_load_all((DEPLOY / "configmap.yaml").read_text())
        if doc and doc.get("kind") == "ConfigMap"
    )["data"]
    for name, default in rows:
        assert getattr(Settings(), name.lower()) == int(default), name
        shipped = config.get(f"SICKBAY_{name}")
        assert shipped is None or int(shipped) == int(default), name
