"""One PNG: W3 (skiplock beside the seed baseline) and W4 over time, throughput and hot-table size."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"skiplock": "tab:blue", "seed": "tab:red"}


def draw(p: dict, path: Path, title: str) -> bool:
    """Draws the pass's W3 and W4 timelines; False when it has neither."""
    w3 = {d: p["timelines"].get(f"W3 {d}") for d in ("skiplock", "seed")}
    w4 = p["timelines"].get("W4 skiplock")
    if not any(w3.values()) and not w4:
        return False
    fig, axes = plt.subplots(2, 2, figsize=(13, 8), squeeze=False)
    (w3_rate, w4_rate), (w3_size, w4_size) = axes
    for design, tl in w3.items():
        if not tl:
            continue
        xs = [s["t"] for s in tl["samples"][1:]]
        w3_rate.plot(xs, [s["rate"] for s in tl["samples"][1:]], marker=".", color=COLORS[design], label=design)
        w3_size.plot([s["t"] for s in tl["samples"]],
                     [(s["table_bytes"] + s["index_bytes"]) / 2**20 for s in tl["samples"]],
                     marker=".", color=COLORS[design], label=f"{design}: table + indexes")
        w3_size.plot([s["t"] for s in tl["samples"]], [s["index_bytes"] / 2**20 for s in tl["samples"]],
                     linestyle=":", color=COLORS[design], label=f"{design}: indexes")
    held = next((tl for tl in w3.values() if tl), None)
    for ax in (w3_rate, w3_size):
        if held:
            ax.axvspan(held["hold_start"], held["hold_end"], color="0.9", label="idle RR transaction")
        ax.set_xlabel("seconds")
    w3_rate.set_title("W3: jobs/s, 16 workers, idle transaction held")
    w3_rate.set_ylabel("jobs/s")
    w3_rate.set_ylim(bottom=0)
    w3_rate.legend(loc="best", fontsize=8)
    w3_size.set_title("W3: hot table size")
    w3_size.set_ylabel("MB")
    w3_size.set_ylim(bottom=0)
    w3_size.legend(loc="best", fontsize=8)
    if w4:
        samples = w4["samples"]
        w4_rate.plot([s["t"] for s in samples[1:]], [s["rate"] for s in samples[1:]], marker=".",
                     color=COLORS["skiplock"], label="jobs/s per sample")
        # the capacity stretches (as fast as they can) just before and just after the soak
        for name, offset in (("W4 capacity before", None), ("W4 capacity after", w4["seconds"])):
            cap = p["timelines"].get(name)
            if cap:
                shift = -cap["seconds"] if offset is None else offset
                w4_rate.plot([shift + s["t"] for s in cap["samples"][1:]], [s["rate"] for s in cap["samples"][1:]],
                             marker="x", linestyle="--", color="tab:gray",
                             label="capacity (as fast as they can)" if offset is None else None)
        if w4.get("rate"):
            w4_rate.axhline(w4["rate"], color="tab:green", linewidth=0.8, label="steady rate asked")
        w4_rate.legend(loc="lower left", fontsize=8)
        w4_rate.set_title(f"W4: soak, {w4['maintenance']['function']} every {w4['maintenance']['every_s']:g} s")
        w4_rate.set_ylabel("jobs/s")
        w4_rate.set_ylim(bottom=0)
        w4_size.plot([s["t"] for s in samples], [(s["table_bytes"] + s["index_bytes"]) / 2**20 for s in samples],
                     marker=".", color=COLORS["skiplock"], label="table + indexes")
        w4_size.plot([s["t"] for s in samples], [s["index_bytes"] / 2**20 for s in samples], linestyle=":",
                     color=COLORS["skiplock"], label="indexes")
        parts = w4_size.twinx()
        parts.step([s["t"] for s in samples], [len(s["partitions"] or []) for s in samples], where="post",
                   color="tab:green", label="history partitions")
        parts.set_ylabel("history partitions")
        parts.set_ylim(bottom=0)
        w4_size.set_title("W4: hot table size, history partitions")
        w4_size.set_ylabel("MB")
        w4_size.set_ylim(bottom=0)
        w4_size.legend(loc="upper left", fontsize=8)
        parts.legend(loc="upper right", fontsize=8)
        for ax in (w4_rate, w4_size):
            ax.set_xlabel("seconds")
    else:
        w4_rate.set_axis_off()
        w4_size.set_axis_off()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
