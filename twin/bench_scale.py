"""Scale benchmark for the cluster twin (not a test): `python -m twin.bench_scale`.

1. Seed 1,000 nodes x 8 GPUs (nodes + one ResourceSlice each) and time it.
2. Create one bound pod per node (1,000 pods) through the store.
3. Through the official client: list all pods (median of several runs) and get each pod
   (median per request); the same list over raw HTTP for comparison.
4. Open 100 concurrent watches on pods, create a pod, and check every watch receives it;
   repeat after a pause to show they stay live.

Prints one JSON document with the figures. Options: --nodes, --gpus, --pods-per-node,
--watches, --gets (how many pods to get one by one; default all).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from typing import Any

import httpx

WATCH_WAIT = 20.0  # seconds to wait for every watch to see an event (generous for 2 CPUs)


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 2)


def run(
    nodes: int, gpus: int, pods_per_node: int, watches: int, gets: int | None
) -> dict[str, Any]:
    from kubernetes import client, config

    from twin.runtime import Twin

    out: dict[str, Any] = {"nodes": nodes, "gpus_per_node": gpus}
    twin = Twin(profile="1.36")
    t0 = time.perf_counter()
    twin.seed(nodes=nodes, gpus_per_node=gpus)
    out["seed_seconds"] = round(time.perf_counter() - t0, 3)
    out["devices"] = nodes * gpus
    store = twin.store
    store.create("namespaces", {"metadata": {"name": "bench"}})
    t0 = time.perf_counter()
    for i in range(nodes):
        for j in range(pods_per_node):
            store.create(
                "pods",
                {
                    "metadata": {
                        "name": f"job-{i}-{j}",
                        "labels": {"app": "bench", "node": str(i)},
                    },
                    "spec": {
                        "nodeName": f"gpu-pool-node-{i}",
                        "containers": [{"name": "main", "image": "registry.invalid/train:1"}],
                    },
                },
                "bench",
            )
    out["pods"] = nodes * pods_per_node
    out["pod_create_seconds"] = round(time.perf_counter() - t0, 3)
    twin.start()
    try:
        kubeconfig = twin.write_kubeconfig(tempfile.mkdtemp(prefix="twin-bench-") + "/kubeconfig")
        api = config.new_client_from_config(str(kubeconfig))
        core = client.CoreV1Api(api)
        list_times = []
        for _ in range(5):
            t0 = time.perf_counter()
            items = core.list_pod_for_all_namespaces().items
            list_times.append(time.perf_counter() - t0)
        assert len(items) == out["pods"]
        names = [str(pod.metadata.name) for pod in items[: gets or len(items)] if pod.metadata]
        out["client_list_all_pods_median_ms"] = _ms(statistics.median(list_times))
        raw_times = []
        with httpx.Client(base_url=twin.url, timeout=30.0) as http:
            for _ in range(5):
                t0 = time.perf_counter()
                http.get("/api/v1/pods").raise_for_status()
                raw_times.append(time.perf_counter() - t0)
            out["http_list_all_pods_median_ms"] = _ms(statistics.median(raw_times))
            get_raw = []
            for name in names:
                t0 = time.perf_counter()
                http.get(f"/api/v1/namespaces/bench/pods/{name}").raise_for_status()
                get_raw.append(time.perf_counter() - t0)
            out["http_get_pod_median_ms"] = _ms(statistics.median(get_raw))
        get_times = []
        for name in names:
            t0 = time.perf_counter()
            core.read_namespaced_pod(name, "bench")
            get_times.append(time.perf_counter() - t0)
        out["client_get_pod_median_ms"] = _ms(statistics.median(get_times))
        out["client_get_pod_p95_ms"] = _ms(sorted(get_times)[int(len(get_times) * 0.95) - 1])
        out["gets"] = len(get_times)
        out.update(_watches(twin, watches))
    finally:
        twin.stop()
    return out


def _watches(twin: Any, count: int) -> dict[str, Any]:
    rv = twin.store.resource_version
    seen: list[list[str]] = [[] for _ in range(count)]
    connected = threading.Barrier(count + 1, timeout=WATCH_WAIT)
    stop = threading.Event()

    def watcher(i: int) -> None:
        url = f"{twin.url}/api/v1/namespaces/bench/pods?watch=true&resourceVersion={rv}&timeoutSeconds=60"
        try:
            with httpx.stream("GET", url, timeout=None) as resp:
                connected.wait()
                for line in resp.iter_lines():
                    if line:
                        seen[i].append(json.loads(line)["object"]["metadata"]["name"])
                    if stop.is_set():
                        break
        except (httpx.HTTPError, OSError):
            pass  # the server closing streams at shutdown

    threads = [threading.Thread(target=watcher, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    connected.wait()
    result: dict[str, Any] = {"watches": count, "server_watch_count": twin.store.watch_count}
    for round_no, pause in enumerate((0.0, 3.0)):
        time.sleep(pause)
        name = f"probe-{round_no}"
        t0 = time.perf_counter()
        twin.store.create(
            "pods",
            {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
            "bench",
        )
        deadline = time.monotonic() + WATCH_WAIT
        while time.monotonic() < deadline and not all(name in s for s in seen):
            time.sleep(0.005)
        result[f"watch_round{round_no}_all_received"] = all(name in s for s in seen)
        result[f"watch_round{round_no}_fanout_ms"] = _ms(time.perf_counter() - t0)
    stop.set()
    twin.store.create(
        "pods",
        {"metadata": {"name": "probe-stop"}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        "bench",
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods-per-node", type=int, default=1)
    parser.add_argument("--watches", type=int, default=100)
    parser.add_argument("--gets", type=int, default=None)
    args = parser.parse_args()
    figures = run(args.nodes, args.gpus, args.pods_per_node, args.watches, args.gets)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
