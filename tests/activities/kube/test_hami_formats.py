"""HAMi's annotations, every format its releases wrote (activities/kube/hami.py): the pod
placement record, the node registration in its three formats, and loud refusals of anything
else (a record Sickbay cannot read exactly is never guessed at)."""

from __future__ import annotations

import json

import pytest

from activities.kube import hami
from activities.kube.hami import HamiFormatError

A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
B = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec"


def _pod(annotations: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"namespace": "ns", "name": "p", "annotations": annotations}}


def test_allocation_two_containers_each_one_share() -> None:
    shares = hami.parse_allocation(f"{A},NVIDIA,3000,0:;{A},NVIDIA,5000,30:;")
    assert [(s.container, s.uuid, s.memory_mb, s.cores) for s in shares] == [
        (0, A, 3000, 0),
        (1, A, 5000, 30),
    ]


def test_allocation_several_gpus_in_one_container_and_empty_containers_kept_in_place() -> None:
    # v2.9+: a container without devices (an init container) keeps its empty segment.
    shares = hami.parse_allocation(f";;{A},NVIDIA,2000,50:{B},NVIDIA,2000,50:;")
    assert [(s.container, s.uuid) for s in shares] == [(2, A), (2, B)]


def test_allocation_mig_suffix_names_the_physical_gpu() -> None:
    [share] = hami.parse_allocation(f"{A}[1-0],NVIDIA,10000,0:;")
    assert share.uuid == A and share.device_id == f"{A}[1-0]"


def test_allocation_emptied_by_the_device_plugin_holds_nothing() -> None:
    assert hami.parse_allocation(";;") == []
    assert hami.parse_allocation("") == []


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (f"{A},NVIDIA,3000:;", "3 fields"),
        (f"{A},NVIDIA,3000,0,extra:;", "5 fields"),
        (f"{A},NVIDIA,lots,0:;", "memory 'lots' is not an integer"),
        (f"{A},NVIDIA,3000,-5:;", "negative"),
        (",NVIDIA,3000,0:;", "lacks a UUID"),
        (f"{A},NVIDIA,3000,0:", "no container separator"),
        (f"{A}[x],NVIDIA,3000,0:;", "malformed MIG suffix"),
    ],
)
def test_allocation_that_does_not_parse_is_refused(value: str, problem: str) -> None:
    with pytest.raises(HamiFormatError, match=problem):
        hami.parse_allocation(value)


def test_pod_without_hami_record_is_none_and_a_pre_2_3_record_is_refused() -> None:
    assert hami.pod_shares(_pod({})) is None
    assert hami.pod_gpu_uuids(_pod({hami.ANN_ALLOCATED: f"{A},NVIDIA,1000,0:;"})) == {A.lower()}
    with pytest.raises(HamiFormatError, match="before v2.3"):
        hami.pod_shares(_pod({"4pd.io/vgpu-ids-new": f"{A},NVIDIA,1000,0:;"}))
    with pytest.raises(HamiFormatError, match="pod ns/p annotation hami.io/vgpu-devices"):
        hami.pod_shares(_pod({hami.ANN_ALLOCATED: "garbage"}))


def test_register_v2_3_seven_fields() -> None:
    fmt, gpus = hami.parse_register(
        f"{B},10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
        f"{A},10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,1,false:"
    )
    assert fmt == hami.FORMAT_SEVEN
    assert [(g.uuid, g.count, g.numa, g.healthy, g.index) for g in gpus] == [
        (B, 10, 0, True, None),
        (A, 10, 1, False, None),
    ]


def test_register_v2_5_nine_fields() -> None:
    fmt, gpus = hami.parse_register(
        f"{A},10,81559,100,NVIDIA-H100,0,true,0,hami-core:{B},10,81559,100,NVIDIA-H100,0,False,1,mig:"
    )
    assert fmt == hami.FORMAT_NINE
    assert [(g.uuid, g.healthy, g.index, g.mode) for g in gpus] == [
        (A, True, 0, "hami-core"),
        (B, False, 1, "mig"),
    ]


def test_register_v2_8_json_omitempty_health_means_unhealthy() -> None:
    value = json.dumps(
        [
            {
                "id": A,
                "count": 10,
                "devmem": 81559,
                "devcore": 100,
                "type": "NVIDIA-H100",
                "mode": "hami-core",
                "health": True,
            },  # fmt: skip
            {
                "id": B,
                "index": 1,
                "count": 10,
                "devmem": 81559,
                "devcore": 100,
                "type": "NVIDIA-H100",
                "mode": "hami-core",
                "migProfiles": [],
            },  # fmt: skip
        ]
    )
    fmt, gpus = hami.parse_register(value)
    assert fmt == hami.FORMAT_JSON
    assert [(g.uuid, g.index, g.numa, g.healthy) for g in gpus] == [
        (A, 0, 0, True),
        (B, 1, 0, False),
    ]
    assert hami.parse_register("[]") == (hami.FORMAT_JSON, [])


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (f"{A},10,32768,100,T4,0:", "6 fields"),
        (f"{A},10,32768,100,T4,0,maybe:", "not a boolean"),
        (f"{A},10,32768,100,T4,0,true:{B},10,32768,100,T4,0,true,1,hami-core:", "mixes"),
        ("no devices here", "neither"),
        ('[{"id": "GPU-1", "health": "yes"}]', "not a boolean"),
        ('[{"count": 10}]', "no GPU id"),
        ('{"id": "GPU-1"}', "not a list"),
        ("[{", "not valid JSON"),
    ],
)
def test_register_that_does_not_parse_is_refused(value: str, problem: str) -> None:
    with pytest.raises(HamiFormatError, match=problem):
        hami.parse_register(value)


def test_device_cordon_is_shared_with_administrators() -> None:
    node: dict[str, object] = {
        "metadata": {"name": "n", "annotations": {hami.ANN_DEVICE_CORDON: B}}
    }
    patch = hami.cordon_change(A)(node)
    assert patch is not None
    annotations = patch["metadata"]["annotations"]
    assert annotations == {hami.ANN_DEVICE_CORDON: f"{B},{A}", hami.ANN_SICKBAY_CORDONED: A}
    node["metadata"]["annotations"] = annotations  # type: ignore[index]
    assert hami.cordon_change(A)(node) is None  # already there
    # Release takes out only Sickbay's own UUID; the administrator's B stays cordoned.
    undo = hami.uncordon_change(A)(node)
    assert undo == {
        "metadata": {"annotations": {hami.ANN_DEVICE_CORDON: B, hami.ANN_SICKBAY_CORDONED: None}}
    }
    assert hami.uncordon_change(B)(node) is None  # not Sickbay's to lift


def test_volcano_vgpu_records() -> None:
    """Volcano's vGPU plugin (HAMi-core): the same placement encoding, containers joined by
    `;` (the last unterminated); its registration 5 fields, later 6 (`,mode`)."""
    pod = _pod({hami.VOLCANO_ALLOCATED: f"{A},NVIDIA,3000,0:;{B},NVIDIA,2000,0:"})
    assert [(s.container, s.uuid) for s in hami.pod_shares(pod) or []] == [(0, A), (1, B)]
    five = hami.parse_volcano_register(
        f"{A},10,32768,NVIDIA-Tesla V100,true:{B},10,32768,T4,false:"
    )
    assert [(g.uuid, g.count, g.healthy, g.mode) for g in five] == [
        (A, 10, True, None),
        (B, 10, False, None),
    ]
    [six] = hami.parse_volcano_register(f"{A},4,4914,NVIDIA-RTX4090,true,hami-core:")
    assert (six.memory_mb, six.mode) == (4914, "hami-core")
    node = {
        "metadata": {"name": "v", "annotations": {hami.VOLCANO_REGISTER: f"{A},4,4914,x,true:"}}
    }
    assert hami.is_hami_node(node) and hami.is_volcano_node(node)
    assert hami.register_key(node) == hami.VOLCANO_REGISTER
    assert [g.uuid for g in hami.node_gpus(node) or []] == [A]
    with pytest.raises(HamiFormatError, match="7 fields; Volcano's vGPU plugin writes 5 or 6"):
        hami.parse_volcano_register(f"{A},10,32768,100,T4,0,true:")
