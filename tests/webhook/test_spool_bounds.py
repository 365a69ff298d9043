"""The delivery spool is bounded in bytes, an alert in label bytes, and a full disk tears no line.

Cases:
- `Spool(max_bytes=...)`: an add that would take the journal past the cap is refused whole
  (SpoolFull, nothing written, nothing pending), the journal never exceeds the cap, and once
  Temporal took enough alerts (done) the journal is compacted and takes alerts again;
- the webhook past the byte cap acknowledges nothing it has not journaled: the notification
  waits for Temporal as without a spool and gets 503 past the deadline (as when Temporal is
  slow), counted in `sickbay_webhook_spool_refused_total{reason="bytes"}`;
- an alert whose labels and annotations are over SICKBAY_WEBHOOK_MAX_ALERT_BYTES (60 labels
  of 1,000 characters, the attack in the issue) is refused as `too-large`, named with its
  size, never sent or journaled, while the other alerts of the notification go through;
- deploy/webhook.yaml's spool `sizeLimit` is the one `spool_disk_bytes` derives from the
  SICKBAY_WEBHOOK_SPOOL_MAX_BYTES it sets (the journal plus a compaction's copy);
- a write that fails part-way (the kernel writes what fits, then fails: what a full disk does;
  made real here with RLIMIT_FSIZE in a child process) leaves no torn line: the journal is cut
  back to its last whole record, the add is reported failed, a `done` that could not be
  written is written with the next record that can, and a reopen skips nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.webhook.helpers import TOKEN, payload, unique_device, xid_alert
from tests.webhook.test_webhook_spool import _alert, controlled
from worker.alerts import AmPayload
from worker.settings import WebhookSettings
from worker.spool import JOURNAL, Spool, SpoolFull, spool_disk_bytes

ROOT = Path(__file__).resolve().parents[2]


def _line_bytes(tmp_path: Path) -> int:
    """Bytes one journaled `_alert` takes."""
    probe = Spool(tmp_path / "probe")
    probe.open()
    probe.add([_alert(1)])
    size = (tmp_path / "probe" / JOURNAL).stat().st_size
    probe.close()
    return size


def test_byte_cap_refuses_whole_adds_and_compaction_makes_room(tmp_path: Path) -> None:
    line = _line_bytes(tmp_path)
    spool = Spool(tmp_path / "s", max_pending=1000, max_bytes=3 * line + line // 2)
    spool.open()
    assert spool.add([_alert(1), _alert(2), _alert(3)]) == 3
    with pytest.raises(SpoolFull, match="bytes"):
        spool.add([_alert(4)])
    assert len(spool.pending) == 3
    journal = tmp_path / "s" / JOURNAL
    assert journal.stat().st_size <= spool.max_bytes
    assert not spool.room(1, line)
    # Temporal took two: their `done` lines go in, then the journal is rewritten with only the
    # one pending, and a new alert fits.
    spool.done(_alert(1).delivery_key())
    spool.done(_alert(2).delivery_key())
    assert spool.add([_alert(4), _alert(5)]) == 2
    assert journal.stat().st_size <= spool.max_bytes
    spool.close()
    again = Spool(tmp_path / "s", max_bytes=spool.max_bytes)
    assert sorted(m.index for m in again.open()) == [3, 4, 5]
    again.close()


async def test_webhook_past_the_byte_cap_answers_503(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wh = WebhookSettings(
        webhook_token=TOKEN,
        webhook_temporal_timeout=0.6,
        webhook_ack_seconds=0.1,
        webhook_spool_dir=tmp_path / "spool",
        webhook_spool_max_bytes=1024 * 1024,
    )
    service, temporal = controlled(wh, monkeypatch)
    assert service.spool is not None and service.spool.max_bytes == 1024 * 1024
    (n1, g1), (n2, g2), (n3, g3) = unique_device(), unique_device(), unique_device()
    code, body = await service.handle(AmPayload.model_validate(payload(xid_alert(n1, g1))))
    assert code == 200 and body["queued"] == 1
    service.spool.max_bytes = service.spool.size + 16  # full: no room for another alert
    code, body = await service.handle(
        AmPayload.model_validate(payload(xid_alert(n2, g2), xid_alert(n3, g3)))
    )
    assert code == 503 and not body["queued"], body
    assert {f["reason"] for f in body["failed"]} == {"temporal-timeout"}
    assert len(service.spool.pending) == 1
    refused = service.metrics.registry.get_sample_value(
        "sickbay_webhook_spool_refused_total", {"reason": "bytes"}
    )
    assert refused == 1
    for _wf, answered in temporal.calls:
        answered.set_result(None)
    await service.drain(5)
    service.spool.close()


async def test_oversized_alert_is_refused_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wh = WebhookSettings(
        webhook_token=TOKEN, webhook_ack_seconds=0.1, webhook_spool_dir=tmp_path / "spool"
    )
    service, temporal = controlled(wh, monkeypatch)
    assert service.spool is not None
    (n1, g1), (n2, g2) = unique_device(), unique_device()
    huge = xid_alert(n1, g1)
    huge["labels"].update({f"padding_{i:02d}": "x" * 1000 for i in range(60)})
    normal = xid_alert(n2, g2)
    code, body = await service.handle(AmPayload.model_validate(payload(huge, normal)))
    assert code == 200, body
    (refused,) = body["unmatched"]
    assert refused["index"] == 0 and refused["reason"] == "too-large"
    assert "SICKBAY_WEBHOOK_MAX_ALERT_BYTES" in refused["detail"]
    assert str(wh.webhook_max_alert_bytes) in refused["detail"]
    assert [r["index"] for r in body["results"]] == [1]
    assert {wf for wf, _ in temporal.calls} <= {body["results"][0]["workflow_id"]}
    journal = (tmp_path / "spool" / JOURNAL).read_text()
    assert "padding_" not in journal
    for _wf, answered in temporal.calls:
        answered.set_result(None)
    await service.drain(5)
    service.spool.close()


def _quantity_bytes(text: str) -> int:
    units = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * factor
    return int(text)


def test_deploy_spool_size_limit_is_derived_from_the_byte_cap() -> None:
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "webhook.yaml").read_text()))
    (deployment,) = [d for d in docs if d and d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    cap = int(env["SICKBAY_WEBHOOK_SPOOL_MAX_BYTES"])
    assert cap == WebhookSettings.model_fields["webhook_spool_max_bytes"].default
    spool_mount = next(m for m in container["volumeMounts"] if m["name"] == "spool")
    assert env["SICKBAY_WEBHOOK_SPOOL_DIR"] == spool_mount["mountPath"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "spool"]
    assert _quantity_bytes(volume["emptyDir"]["sizeLimit"]) == spool_disk_bytes(cap)


_TORN = textwrap.dedent(
    """
    import json, resource, signal, sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    from tests.webhook.test_webhook_spool import _alert
    from worker.spool import JOURNAL, Spool

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: EFBIG, not a signal
    directory = Path({directory!r})
    spool = Spool(directory)
    spool.open()
    spool.add([_alert(1), _alert(2)])
    size = (directory / JOURNAL).stat().st_size
    # Room for half a record more: the kernel writes what fits, then the write fails.
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 40, resource.RLIM_INFINITY))
    result = {{"size": size}}
    try:
        spool.add([_alert(3)])
        result["add"] = "ok"
    except OSError as exc:
        result["add"] = exc.errno
    result["after_add"] = (directory / JOURNAL).stat().st_size
    spool.done(_alert(1).delivery_key())  # fails too: must not tear, must not be lost
    result["after_done"] = (directory / JOURNAL).stat().st_size
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    spool.add([_alert(4)])  # the disk has room again
    result["pending"] = sorted(m.index for m in spool.pending.values())
    spool.close()
    print(json.dumps(result))
    """
)


def test_a_failed_write_leaves_no_torn_line(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    script = _TORN.format(root=str(ROOT), tests=str(ROOT), directory=str(directory))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["add"] != "ok", "the add past the limit must be reported failed"
    assert result["after_add"] == result["size"], "the journal keeps a torn partial record"
    assert result["after_done"] == result["size"]
    assert result["pending"] == [2, 4]
    raw = (directory / JOURNAL).read_bytes()
    assert raw.endswith(b"\n")
    records = [json.loads(line) for line in raw.splitlines()]  # every line whole
    ops = [r["op"] for r in records]
    assert ops.count("done") == 1, ops  # the done that failed was written once room was back
    again = Spool(directory)
    assert sorted(m.index for m in again.open()) == [2, 4]
    again.close()
