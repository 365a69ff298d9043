"""PNG plots for BENCHMARKS.md (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _cdf(ax: Any, values: list[float], label: str) -> None:
    xs = sorted(values)
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post", label=label)


def latency(result: dict[str, Any], path: Path) -> Path:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 5))
    _cdf(ax1, result["sickbay_ms"], f"Sickbay (p50 {result['sickbay']['p50']:.0f} ms)")
    _cdf(ax1, result["peer_ms"], f"straight-line script (p50 {result['peer']['p50']:.0f} ms)")
    if result.get("floor_ms"):
        _cdf(
            ax1,
            result["floor_ms"],
            f"floor: eager start + local activities (p50 {result['floor']['p50']:.0f} ms)",
        )
    for x, style in ((100, ":"), (250, "--")):
        ax1.axvline(x, color="grey", linestyle=style, linewidth=1)
    ax1.set_xscale("log")
    ax1.set_xlabel("alert POST -> DeviceTaintRule created (ms, log)")
    ax1.set_ylabel("fraction of remediations")
    ax1.set_title(f"Latency CDF, {result['measured']} remediations (goals: 100 / 250 ms)")
    # Below the axes: the curves span the whole height, a legend inside would hide one.
    ax1.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize="small")
    ax1.grid(True, alpha=0.3)
    steps = result.get("gap_before_call_ms") or {}
    names = [k for k, v in steps.items() if v.get("n", 0) >= max(1, result["measured"] // 2)]
    meds = [steps[k]["p50"] for k in names]
    ax2.barh(names[::-1], meds[::-1], color="tab:orange")
    ax2.set_xlabel("median worker time before the call (ms)")
    ax2.set_title("Where the hot path's time goes")
    ax2.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def storm(result: dict[str, Any], path: Path) -> Path:
    prog = result["progress"]
    rss = result.get("worker_rss") or []
    fig, (ax, ax3) = plt.subplots(
        2, 1, figsize=(10, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]}
    )
    acked, total = [], 0
    for t, n in prog["acked"]:
        total += n
        acked.append((t, total))
    if acked:
        ax.step([t for t, _ in acked], [v for _, v in acked], where="post", label="alerts acked")
    ax.set_xlabel("seconds since the first alert")
    ax.set_ylabel("alerts acknowledged (200)")
    ax2 = ax.twinx()
    for key, label, color in (
        ("started", "remediations started", "tab:green"),
        ("rules", "DeviceTaintRules created", "tab:red"),
    ):
        xs = prog[key]
        if xs:
            ax2.step(xs, range(1, len(xs) + 1), where="post", label=label, color=color)
    ax2.axhline(result["budget_limit"], color="grey", linestyle="--", linewidth=1)
    ax2.set_ylabel("count")
    ax.set_title(
        f"Storm: {result['alerts']} alerts over {result['devices']} GPUs, offered "
        f"{result['offered_rate']}/s (budget line: {result['budget_limit']} GPUs)"
    )
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="center right")
    ax.grid(True, alpha=0.3)
    if rss:
        ax3.plot([t for t, _ in rss], [v for _, v in rss], color="tab:purple", linewidth=1)
    ax3.set_ylabel("worker RSS (MiB)")
    ax3.set_xlabel("seconds since the first alert")
    ax3.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def memory(result: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 3.5))
    xs = [t for t, _ in result["samples"]]
    ys = [v for _, v in result["samples"]]
    ax.plot(xs, ys, marker=".", linewidth=1)
    ax.axhline(300, color="grey", linestyle="--", linewidth=1, label="goal 300 MB")
    ax.set_xlabel("seconds since the first alert")
    ax.set_ylabel("worker RSS (MiB)")
    ax.set_title(f"Worker memory, {result['remediations']} remediations going in flight")
    ax.legend(loc="lower right")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def watch_curve(curve: dict[str, Any], path: Path) -> Path:
    """The health watcher's cost against cluster size (bench/watch.py's curve), the goals as
    dashed lines."""
    points = [p for p in curve["points"] if "error" not in p]
    xs = [p["pods"] for p in points]
    mb = 1.048576  # MiB -> MB
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    panels = (
        (
            axes[0][0],
            "watcher RSS (MB)",
            [
                ("after the first sync", [p["rss_mb_after_sync"] * mb for p in points]),
                ("peak", [p["max_rss_mb"] * mb for p in points]),
            ],
            300,
        ),
        (
            axes[0][1],
            "first sync (s)",
            [("LIST of slices, nodes, pods", [p["sync_seconds"] for p in points])],
            30,
        ),
        (
            axes[1][0],
            "pod health Unhealthy -> launch (ms)",
            [
                ("p50", [p["detection_ms"]["p50"] for p in points]),
                ("p99", [p["detection_ms"]["p99"] for p in points]),
            ],
            1000,
        ),
        (
            axes[1][1],
            "CPU seconds per idle minute",
            [("watcher process", [p["cpu_seconds_per_idle_minute"] for p in points])],
            None,
        ),
    )
    for ax, title, series, goal in panels:
        for label, ys in series:
            ax.plot(xs, ys, marker="o", label=label)
        if goal is not None:
            ax.axhline(goal, color="grey", linestyle="--", linewidth=1, label=f"goal {goal}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x // 1000}k" if x >= 1000 else str(x) for x in xs])
        ax.set_xlabel("pods (1 in 4 on GPU nodes)")
        ax.set_title(title)
        if goal == 1000:  # milliseconds: the figures sit orders of magnitude under the goal
            ax.set_yscale("log")
            ax.set_title(title + " (log)")
        else:
            ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle("Health watcher cost against cluster size")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
