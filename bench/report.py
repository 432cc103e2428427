"""The results as Markdown (stdout and bench/RESULTS.md), the targets of the issue, raw JSON."""

from __future__ import annotations

import json
from pathlib import Path

from bench import timeline

CLIENTS = (1, 4, 16)
ORDER = [("ceiling-insert", "ceiling", "ceiling: single-row INSERT, before the workloads (tx/s)"),
         ("ceiling-insert-again", "ceiling", "ceiling: single-row INSERT again, after W1–W2b (tx/s)"),
         ("ceiling-select1", "ceiling", "ceiling: SELECT 1 (tx/s)"),
         ("W1", "skiplock", "W1 enqueue, 1 per transaction (no worker waits: no NOTIFY)"),
         ("W1", "skiplock-waiting", "W1 enqueue while a worker LISTENs and drains the stage (one NOTIFY per wait)"),
         ("W1", "seed", "W1 seed baseline: the article's insert"),
         ("W1b", "skiplock", "W1b enqueue_batch, 1,000 per call"),
         ("W2", "skiplock", "W2 take_next + finish (2 calls, 2 commits, 2 round trips)"),
         ("W2", "skiplock-combined", "W2 finish_and_take (1 call, 1 commit, 1 round trip)"),
         ("W2", "skiplock-locked", "W2 take_locked + finish_locked in one transaction (2 calls, 1 commit, 3 round trips: BEGIN, take, finish + COMMIT pipelined)"),
         ("W2", "seed", "W2 seed baseline: the article's take + finish (2 commits, 2 round trips)"),
         ("W2b", "skiplock", "W2b take 100 + finish_batch 100"),
         ("S4-insert", "seed004", "seed 004 insert: its article's ins_task_init, a table per tenant of 1,000"),
         ("S4-insert", "skiplock", "seed 004 insert on skiplock: enqueue, a stage per tenant"),
         ("S4-consume", "seed004", "seed 004 consume: its article's run_task, a random tenant's 1,000 to history"),
         ("S4-consume", "skiplock", "seed 004 consume on skiplock: consume(stage, 1000) of a random tenant"),
         ("S4-consume", "skiplock-drain", "seed 004 consume on skiplock: drain(stage, 1000) of a random tenant (busy: nothing)"),
         ("S4-consume", "skiplock-drain-none", "seed 004 consume on skiplock: drain(stage, 1000), stages at history => 'none'"),
         ("S4-insert", "bound", "seed 004 insert, floor: the INSERT into queue.live_tasks enqueue runs, no function"),
         ("S4-consume", "bound", "seed 004 consume, floor: the statement consume runs, no function")]


def _floor(bound: dict | None, seed: dict | None) -> str:
    """The same-run floor of a seed 004 target: skiplock's statement with no function around it."""
    if not bound or not seed or not seed["jobs_per_s"]:
        return ""
    return f"; its statement bare, no function: {bound['jobs_per_s'] / seed['jobs_per_s']:.2f}×"


def point(p: dict, workload: str, design: str, clients: int) -> dict | None:
    return next((x for x in p["points"] if x["workload"] == workload and x["design"] == design
                 and x["clients"] == clients), None)


def insert_ceiling(p: dict, clients: int) -> float | None:
    """The ceiling every ratio divides by: the mean of the INSERT ceiling measured before the
    workloads and again after them (runs without the second measurement: the first alone)."""
    found = [c["jobs_per_s"] for c in (point(p, "ceiling-insert", "ceiling", clients),
                                       point(p, "ceiling-insert-again", "ceiling", clients)) if c]
    return sum(found) / len(found) if found else None


def ratio(p: dict, jobs: float, clients: int) -> float | None:
    ceiling = insert_ceiling(p, clients)
    return jobs / ceiling if ceiling else None


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MB"


def _x(r: float | None) -> str:
    return "–" if r is None else f"{r:.2f}×"


# -- targets -------------------------------------------------------------------------------------

def _best_ratio_elsewhere(p: dict, points: list[dict], best: dict) -> str:
    """The target is judged at the most jobs/s; say so when another client count has the best ratio."""
    top = max(points, key=lambda x: ratio(p, x["jobs_per_s"], x["clients"]) or 0)
    if top is best:
        return ""
    return (f"; best ratio {_x(ratio(p, top['jobs_per_s'], top['clients']))} at {top['clients']} "
            f"client{'s' if top['clients'] != 1 else ''} ({top['jobs_per_s']:,.0f} jobs/s)")


def targets(results: dict) -> list[tuple[str, str, bool | None]]:
    """(target, what was measured, met) for every target of the issue, from the default pass."""
    p = results["passes"][0]
    rows: list[tuple[str, str, bool | None]] = []

    def add(name: str, value: float | None, limit: float, detail: str, at_most: bool = False) -> None:
        if value is None:
            rows.append((name, "not measured in this run", None))
        else:
            rows.append((name, detail, value <= limit if at_most else value >= limit))

    w1 = point(p, "W1", "skiplock", 16)
    add("W1 ≥ 0.85 × INSERT ceiling (16 clients)", w1 and ratio(p, w1["jobs_per_s"], 16), 0.85,
        w1 and f"{w1['jobs_per_s']:,.0f} jobs/s = {_x(ratio(p, w1['jobs_per_s'], 16))}")
    w1q = point(p, "W1", "skiplock-waiting", 16)
    add("W1 ≥ 0.85 × INSERT ceiling while a worker waits (one NOTIFY per wait; 16 clients)",
        w1q and ratio(p, w1q["jobs_per_s"], 16), 0.85,
        w1q and f"{w1q['jobs_per_s']:,.0f} jobs/s = {_x(ratio(p, w1q['jobs_per_s'], 16))}")
    rel = w1q["jobs_per_s"] / w1["jobs_per_s"] if w1q and w1 and w1["jobs_per_s"] else None
    add("W1 while a worker waits ≥ 0.9 × W1 with none (16 clients)", rel, 0.9,
        rel is not None and f"{w1q['jobs_per_s']:,.0f} vs {w1['jobs_per_s']:,.0f} jobs/s = {rel:.2f}×")
    # W2 as a worker would run it, in whichever of the three worker loops does best.
    loops = {"skiplock": "take_next + finish", "skiplock-combined": "finish_and_take",
             "skiplock-locked": "take_locked + finish_locked"}
    w2 = max((x for x in (point(p, "W2", d, 16) for d in loops) if x),
             key=lambda x: x["jobs_per_s"], default=None)
    how = w2 and loops[w2["design"]]
    add("W2 ≥ 0.40 × INSERT ceiling (16 clients)", w2 and ratio(p, w2["jobs_per_s"], 16), 0.40,
        w2 and f"{w2['jobs_per_s']:,.0f} jobs/s = {_x(ratio(p, w2['jobs_per_s'], 16))} ({how})")
    seed = point(p, "W2", "seed", 16)
    rel = w2["jobs_per_s"] / seed["jobs_per_s"] if w2 and seed and seed["jobs_per_s"] else None
    add("W2 ≥ 2 × seed baseline (16 clients)", rel, 2.0,
        rel is not None and f"{w2['jobs_per_s']:,.0f} vs {seed['jobs_per_s']:,.0f} jobs/s = {rel:.2f}×")
    w2b = [x for x in p["points"] if x["workload"] == "W2b"]
    if w2b:
        best = max(w2b, key=lambda x: x["jobs_per_s"])
        r = ratio(p, best["jobs_per_s"], best["clients"])
        add("W2b ≥ 4 × INSERT ceiling at its best client count", r, 4.0,
            f"{best['jobs_per_s']:,.0f} jobs/s at {best['clients']} client{'s' if best['clients'] != 1 else ''} = {_x(r)}"
            + (" (backlog ran out: lower bound)" if best["drained"] else "")
            + _best_ratio_elsewhere(p, w2b, best))
    else:
        add("W2b ≥ 4 × INSERT ceiling at its best client count", None, 4.0, "")
    w3 = p.get("summaries", {}).get("W3 skiplock")
    if w3:
        add("W3 throughput during the hold ≥ 0.8 × before", w3["hold_ratio"], 0.8,
            f"{w3['rate_hold']:,.0f} vs {w3['rate_before']:,.0f} jobs/s = {w3['hold_ratio']:.2f}×")
        rec = w3["recovery_s"]
        rows.append(("W3 back to ≥ 0.95 × before within 30 s of the hold's end",
                     "never within the run" if rec is None else f"after {rec:.0f} s",
                     rec is not None and rec <= 30.5))
        add("W3 hot table + indexes after the hold ≤ 2 × before", w3["size_ratio_after"], 2.0,
            f"{_mb(w3['sizes']['after']['total_bytes'])} vs {_mb(w3['sizes']['before']['total_bytes'])}"
            f" = {w3['size_ratio_after']:.2f}×", at_most=True)
    else:
        for name in ("W3 throughput during the hold ≥ 0.8 × before", "W3 back to ≥ 0.95 × before within 30 s",
                     "W3 hot table + indexes after the hold ≤ 2 × before"):
            add(name, None, 0, "")
    w4 = p.get("summaries", {}).get("W4 skiplock")
    if w4:
        unit = "minute" if w4["bucket_s"] == 60 else f"{w4['bucket_s']:.0f} s"
        steady = (f" at a steady {w4['rate_target']:,.0f} jobs/s ({w4['load']:.0%} of the capacity before)"
                  if w4.get("rate_target") else " (as fast as they can)")
        add(f"W4 last {unit}'s throughput ≥ 0.95 × the first's", w4["rate_ratio"], 0.95,
            f"{w4['rate_last']:,.0f} vs {w4['rate_first']:,.0f} jobs/s = {w4['rate_ratio']:.3f}×{steady}")
        add("W4 hot table bounded: grows ≤ 25 % over the soak's second half", w4["size_growth_second_half"], 1.25,
            f"{_mb(w4['size_middle'])} at half time, {_mb(w4['size_end'])} at the end "
            f"({w4['size_growth_second_half']:.2f}×); at most {_mb(w4['size_max'])}", at_most=True)
        if w4.get("capacity_ratio") is not None:
            rows.append(("W4 (no target) capacity just after the soak vs just before, as fast as they can",
                         f"{w4['capacity_after']:,.0f} vs {w4['capacity_before']:,.0f} jobs/s = {w4['capacity_ratio']:.2f}×",
                         None))
        if w4.get("latency_first_ms") is not None and w4.get("latency_last_ms") is not None:
            rows.append((f"W4 (no target) mean latency of a take + finish, last {unit} vs first",
                         f"{w4['latency_last_ms']:.1f} vs {w4['latency_first_ms']:.1f} ms", None))
    else:
        add("W4 last minute's throughput ≥ 0.95 × the first's", None, 0, "")
        add("W4 hot table bounded", None, 0, "")
    for kind, limit in (("insert", 0.8), ("consume", 0.5)):
        sk, sd = point(p, f"S4-{kind}", "skiplock", 16), point(p, f"S4-{kind}", "seed004", 16)
        rel = sk["jobs_per_s"] / sd["jobs_per_s"] if sk and sd and sd["jobs_per_s"] else None
        add(f"seed 004 {kind}: skiplock ≥ {limit} × the article's design (16 clients)", rel, limit,
            rel is not None and f"{sk['jobs_per_s']:,.0f} vs {sd['jobs_per_s']:,.0f} tasks/s = {rel:.2f}×"
            + (" (backlog mostly consumed: lower bounds)" if sk["drained"] or sd["drained"] else "")
            + _floor(point(p, f"S4-{kind}", "bound", 16), sd))
    for design, what in (("skiplock-drain", "with drain"), ("skiplock-drain-none", "with drain, history => 'none'")):
        dr, sd = point(p, "S4-consume", design, 16), point(p, "S4-consume", "seed004", 16)
        rel = dr["jobs_per_s"] / sd["jobs_per_s"] if dr and sd and sd["jobs_per_s"] else None
        add(f"seed 004 consume {what}: skiplock ≥ 0.5 × the article's design (16 clients)", rel, 0.5,
            rel is not None and f"{dr['jobs_per_s']:,.0f} vs {sd['jobs_per_s']:,.0f} tasks/s = {rel:.2f}×"
            + (" (backlog mostly consumed: lower bounds)" if dr["drained"] or sd["drained"] else ""))
    first, again = point(p, "ceiling-insert", "ceiling", 16), point(p, "ceiling-insert-again", "ceiling", 16)
    if first and again and first["jobs_per_s"]:
        rows.append(("(no target) the INSERT ceiling at 16 clients, before the workloads and again after W1–W2b; "
                     "ratios divide by their mean",
                     f"{first['jobs_per_s']:,.0f} and {again['jobs_per_s']:,.0f} tx/s "
                     f"(second / first {again['jobs_per_s'] / first['jobs_per_s']:.2f}×); "
                     f"mean {insert_ceiling(p, 16):,.0f}", None))
    return rows


# -- markdown ------------------------------------------------------------------------------------

def points_table(p: dict) -> list[str]:
    lines = ["| workload | 1 client | 4 clients | 16 clients |", "|---|--:|--:|--:|"]
    for workload, design, label in ORDER:
        cells = []
        for c in CLIENTS:
            x = point(p, workload, design, c)
            if x is None:
                cells.append("")
            elif design == "ceiling":
                cells.append(f"{x['jobs_per_s']:,.0f}")
            else:
                mark = "*" if x.get("drained") else ""
                cells.append(f"{x['jobs_per_s']:,.0f}{mark} ({_x(ratio(p, x['jobs_per_s'], c))})")
        if any(cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def w3_tables(p: dict, detail: bool = True) -> list[str]:
    tls = {d: p["timelines"].get(f"W3 {d}") for d in ("skiplock", "seed")}
    sums = {d: p["summaries"].get(f"W3 {d}") for d in ("skiplock", "seed")}
    present = [d for d in ("skiplock", "seed") if tls[d]]
    if not present:
        return []
    ins16 = insert_ceiling(p, 16)
    first = tls[present[0]]
    lines = [f"Hold from {first['hold_start']:.0f} s to {first['hold_end']:.0f} s; "
             f"16 workers; the producer keeps {first['backlog']:,} tasks waiting.", ""]
    m = (tls.get("skiplock") or {}).get("maintenance")
    if m:
        lines += [f"skiplock runs `{m['function']}` every {m['every_s']:g} s, as deployed ({m['calls']} calls, "
                  f"{m['mean_ms']} ms on average, at most {m['longest_ms']} ms; {m['error_count']} errors); "
                  "the seed has no housekeeping. What it did besides reaping: "
                  + ("; ".join(m["actions"][:10]) or "nothing") + ".", ""]
    lines += ["| | " + " | ".join(present) + " |", "|---|" + "--:|" * len(present)]

    def row(label: str, fmt) -> None:
        lines.append(f"| {label} | " + " | ".join(fmt(sums[d]) for d in present) + " |")

    row("jobs/s before the hold", lambda s: f"{s['rate_before']:,.0f} ({_x(s['rate_before'] / ins16 if ins16 else None)})")
    row("jobs/s during the hold (mean)", lambda s: f"{s['rate_hold']:,.0f} ({s['hold_ratio']:.2f}× before)")
    row("jobs/s during the hold (lowest 10 s)", lambda s: f"{s['rate_hold_min']:,.0f}")
    row("jobs/s after the hold (mean)", lambda s: f"{s['rate_after']:,.0f}")
    row("back to ≥ 0.95 × before", lambda s: "never" if s["recovery_s"] is None else f"after {s['recovery_s']:.0f} s")
    for moment in ("before", "end of hold", "after"):
        row(f"hot table + indexes, {moment}",
            lambda s, m=moment: f"{_mb(s['sizes'][m]['table_bytes'])} + {_mb(s['sizes'][m]['index_bytes'])}")
        row(f"dead tuples, {moment}", lambda s, m=moment: f"{s['sizes'][m]['dead_tuples']:,}")
    row("size after / before", lambda s: f"{s['size_ratio_after']:.2f}×")
    if not detail:
        return lines
    lines += ["", "Throughput every sample (jobs/s; hot table + indexes):", ""]
    lines += ["| t (s) | phase | " + " | ".join(present) + " |", "|--:|---|" + "--:|" * len(present)]
    by_t = [tls[d]["samples"] for d in present]
    for i, s in enumerate(by_t[0][1:], start=1):
        cells = []
        for samples in by_t:
            if i < len(samples):
                x = samples[i]
                cells.append(f"{x['rate']:,.0f}; {_mb(x['table_bytes'] + x['index_bytes'])}")
            else:
                cells.append("")
        lines.append(f"| {s['t']:.0f} | {s['phase']} | " + " | ".join(cells) + " |")
    lines += cpu_table(tls, present)
    lines += ["", "The claim query (EXPLAIN ANALYZE, BUFFERS of one take; the statement inside take_next):", ""]
    lines += ["| moment | " + " | ".join(present) + " |", "|---|" + "--:|" * len(present)]
    moments = [pl["moment"] for pl in tls[present[0]]["plans"]]
    for m in moments:
        cells = []
        for d in present:
            pl = next((x for x in tls[d]["plans"] if x["moment"] == m), None)
            cells.append("" if pl is None or pl["duration_ms"] is None else
                         f"{pl['duration_ms']:.2f} ms, {pl['shared_hit'] + pl['shared_read']:,} buffers")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    for d in present:
        pl = next((x for x in tls[d]["plans"] if x["moment"] == "end of hold"), None)
        if pl:
            lines += ["", f"<details><summary>{d}: the claim's plan at the end of the hold</summary>", "",
                      "```", pl["text"].strip(), "```", "", "</details>"]
    return lines


def cpu_table(tls: dict, present: list[str]) -> list[str]:
    """Where the CPU of each W3 sample went (bench/timeline.py, CpuWatch), for each design."""
    lines = []
    for d in present:
        samples = [x for x in tls[d]["samples"][1:] if x.get("cpu")]
        if not samples:
            continue
        kinds = [k for k in samples[0]["cpu"] if any(x["cpu"].get(k) for x in samples)]
        lines += ["", f"Where the CPU went, {d}: CPU-seconds of each interval (2 cores give 20 in 10 s). "
                  "Backends: the workers, the producer and the harness's sessions; outside PostgreSQL: "
                  "pgbench, the harness and the kernel's own work; idle includes waiting for the disk.", ""]
        waits = any(x.get("waits") for x in samples)
        if waits:
            lines[-2] += (f" Waits: how often a poll (every {timeline.CpuWatch.EVERY:g} s) found an active backend "
                          "waiting, by `wait_event_type:wait_event`, the three most seen.")
        wal = all(x.get("wal") for x in tls[d]["samples"])
        if wal:
            lines[-2] += (" WAL: bytes written per job finished in the interval (cluster-wide), full-page "
                          "images per 1,000 jobs, and checkpoints begun.")
        lines += ["| t (s) | phase | jobs/s | " + " | ".join(kinds)
                  + (" | WAL B/job | FPI/1k jobs | ckpt" if wal else "") + (" | waits |" if waits else " |"),
                  "|--:|---|--:|" + "--:|" * len(kinds) + ("--:|--:|--:|" if wal else "") + ("---|" if waits else "")]
        previous = tls[d]["samples"][0]
        for x in samples:
            top = ", ".join(f"{k} {n}" for k, n in list((x.get("waits") or {}).items())[:3])
            jobs = max(1, x["processed"] - previous["processed"])
            cells = ""
            if wal:
                w, v = x["wal"], previous["wal"]
                cells = (f" {(w['bytes'] - v['bytes']) / jobs:,.0f} | {1000 * (w['fpi'] - v['fpi']) / jobs:,.0f} |"
                         f" {w['checkpoints'] - v['checkpoints']} |")
            lines.append(f"| {x['t']:.0f} | {x['phase']} | {x['rate']:,.0f} | "
                         + " | ".join(f"{x['cpu'].get(k, 0):.1f}" for k in kinds) + " |"
                         + cells + (f" {top} |" if waits else ""))
            previous = x
    return lines


def w4_tables(p: dict) -> list[str]:
    tl = p["timelines"].get("W4 skiplock")
    s = p["summaries"].get("W4 skiplock")
    if not tl or not s:
        return []
    m = tl["maintenance"] or {}
    lines = [f"16 workers, the producer keeps {tl['backlog']:,} tasks waiting, `{m.get('function')}` every "
             f"{m.get('every_s')} s ({m.get('calls')} calls, {m.get('mean_ms')} ms on average, at most "
             f"{m.get('longest_ms')} ms; {m.get('error_count')} errors).", ""]
    if m.get("function") != "queue.maintain()":
        lines += ["`queue.maintain()` does not exist yet: the maintenance loop called `queue.reap_hung()` "
                  "in its place, so history partitions do not rotate in this run.", ""]
    elif m.get("policy"):
        lines += [f"History policy for the soak (rotate_every shortened to a minute so that rotation runs "
                  f"under load): {m['policy']}.", ""]
    planted = p.get("notes", {}).get("W4 old history")
    if planted:
        lines += [f"Just before the soak the harness added {planted}, so that the soak's rotations drop "
                  "partitions holding rows while the workers finish tasks into history.", ""]
    # fire_schedules reports every call; only the calls that did something say anything here
    actions = [a for a in m.get("actions") or [] if "no schedule due" not in a]
    if actions:
        lines += ["Rotations maintain() ran (besides reaping):", ""] + [f"- {a}" for a in actions[:30]] + [""]
    for e in m.get("errors") or []:
        lines += [f"- maintenance error: `{e}`"]
    unit = "minute" if s["bucket_s"] == 60 else f"{s['bucket_s']:.0f} s"
    if s.get("rate_target"):
        lines += [f"Capacity just before the soak (as fast as they can, {_secs(p, 'W4 capacity before')}): "
                  f"{s['capacity_before']:,.0f} jobs/s. The soak runs the workers at a steady "
                  f"{s['rate_target']:,.0f} jobs/s ({s['load']:.0%} of it; pgbench --rate), latency counted from "
                  f"each take's scheduled start, so it grows if they fall behind. Capacity just after: "
                  f"{s['capacity_after']:,.0f} jobs/s ({s['capacity_ratio']:.2f}× before).", ""]
    lines += [f"| until (s) | jobs/s in that {unit} | latency (ms) | schedule lag (ms) | hot table + indexes | dead tuples | history partitions |",
              "|--:|--:|--:|--:|--:|--:|--:|"]
    for b in s["buckets"]:
        lat = "–" if b.get("latency_ms") is None else f"{b['latency_ms']:.1f}"
        lag = "–" if b.get("lag_ms") is None else f"{b['lag_ms']:.1f}"
        lines.append(f"| {b['until_s']} | {b['rate']:,.0f} | {lat} | {lag} | {_mb(b['total_bytes'])} | {b['dead_tuples']:,} | {b['partitions']} |")
    lines += ["", f"History partitions seen: {', '.join(s['partitions_seen']) or 'none'}."]
    return lines


# (workload, design, label, commits per job) for the account of what a durable commit adds
COMMITS = [("ceiling-insert", "ceiling", "ceiling: single-row INSERT (mean of its two measurements)", 1),
           ("W1", "skiplock", "W1 enqueue", 1),
           ("W1", "seed", "W1 seed: the article's insert", 1),
           ("W2", "skiplock", "W2 take_next + finish", 2),
           ("W2", "skiplock-combined", "W2 finish_and_take", 1),
           ("W2", "skiplock-locked", "W2 take_locked + finish_locked", 1),
           ("W2", "seed", "W2 seed: the article's take + finish", 2),
           ("W2b", "skiplock", "W2b take 100 + finish_batch 100", 0.02)]


def commit_cost(results: dict, clients: int = 16) -> list[str]:
    """Time per job with and without synchronous_commit, from the two passes of this run: what a
    durable commit adds, and so how much time per job the W1 and W2 targets leave the queue."""
    if len(results["passes"]) < 2:
        return []
    durable, fast = results["passes"][0], results["passes"][1]
    rows, cost = [], {}
    for workload, design, label, commits in COMMITS:
        a = point(durable, workload, design, clients)
        b = point(fast, workload, design, clients)
        if not (a and b and a["jobs_per_s"] and b["jobs_per_s"]):
            continue
        if design == "ceiling":   # both measurements of the ceiling, as the ratios use
            us_durable, us_fast = 1e6 / insert_ceiling(durable, clients), 1e6 / insert_ceiling(fast, clients)
        else:
            us_durable, us_fast = 1e6 / a["jobs_per_s"], 1e6 / b["jobs_per_s"]
        cost[(workload, design)] = (us_fast, us_durable)
        rows.append(f"| {label} | {commits:g} | {us_fast:,.1f} | {us_durable:,.1f} | "
                    f"{(us_durable - us_fast) / commits:,.1f} |")
    if not rows:
        return []
    lines = ["", f"## What a durable commit adds ({clients} clients)", "",
             "Microseconds of the whole machine per job (1,000,000 / jobs/s, all clients together) in the "
             "pass with `synchronous_commit = off`, where a commit costs almost nothing, and in the pass with "
             "default durability; the difference divided by the commits per job is what waiting for the "
             "WAL flush adds to each commit. The two passes ran on separate clusters a few minutes apart, "
             "so this is an account, not a measurement of one thing.", "",
             "| workload | commits per job | µs per job, synchronous_commit = off | µs per job, default durability | "
             "added per commit (µs) |", "|---|--:|--:|--:|--:|"] + rows
    ceiling = insert_ceiling(durable, clients)
    flush = cost.get(("ceiling-insert", "ceiling"))
    if ceiling and flush:
        budget = flush[1] - flush[0]
        for target, share, key, name in ((0.85, "W1", ("W1", "skiplock"), "an enqueue"),
                                         (0.40, "W2", ("W2", "skiplock-combined"), "a finish_and_take"),
                                         (0.40, "W2", ("W2", "skiplock-locked"), "a take_locked + finish_locked")):
            if key not in cost:
                continue
            allowed = 1e6 / (target * ceiling)
            lines += ["", f"{share} ≥ {target:.2f}× the ceiling allows {allowed:,.1f} µs per job at default "
                      f"durability. If its one commit adds what the ceiling's does ({budget:,.1f} µs), that "
                      f"leaves {allowed - budget:,.1f} µs for the work of {name}, which took "
                      f"{cost[key][0]:,.1f} µs per job with `synchronous_commit = off` "
                      f"({cost[key][0] / (allowed - budget):.1f}× that)."]
    return lines


def _secs(p: dict, name: str) -> str:
    tl = p["timelines"].get(name)
    return f"{tl['seconds']:.0f} s" if tl else "not run"


def markdown(results: dict, chart: str | None) -> str:
    m = results["machine"]
    out = ["# skiplock benchmark results", ""]
    if results["quick"] or results["only"]:
        out += ["> **Development run** (" + ", ".join(
            x for x in ("--quick: short durations" if results["quick"] else "",
                        f"--only {','.join(results['only'])}" if results["only"] else "") if x)
                + "): not representative.", ""]
    out += [f"Run {results['started']} – {results['finished']} ({results['elapsed_min']:.1f} min), with:", "",
            "```sh", results["command"], "```", "",
            "## Machine and settings", "",
            f"- {m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']:.1f} GiB memory, {m['os']}",
            f"- {m['postgres']}; {m['pgbench']}",
            f"- skiplock built from {'schema/ (--from-schema)' if results['from_schema'] else 'its Alembic migrations (head)'}",
            f"- load average (1, 5, 15 min) when the run began: {m['loadavg']}; when it ended: {m.get('loadavg_end', '?')}"]
    out.append(f"- CPU used by other work just before the run: {m['cpu_busy_before']:.0%}")
    if m["cpu_busy_before"] > 0.25:
        out += ["", "> **The machine was busy** before the run began: other work shared the CPUs, so absolute "
                "numbers are low and noisy; even ratios measured in the same pass move with it."]
    out += [""]
    for p in results["passes"]:
        out.append(f"- pass **{p['name']}**: " + ", ".join(f"{k}={v}" for k, v in p["settings"].items()))
    out += ["", "## Method", "",
            "Every pass starts a throwaway cluster (PostgreSQL's default durability: fsync on, "
            "synchronous_commit on; the second pass only turns synchronous_commit off). pgbench runs custom "
            f"scripts (bench/scripts/) with `-M prepared` over the unix socket, {results['config']['point_seconds']:g} s "
            "per point, from emptied tables. The ceiling is measured in the same pass at the same client "
            "counts, the single-row INSERT twice: before the workloads and again after W1–W2b, because the "
            "disk's fsync time moves within a run. Every ratio is to the mean of those two at the same "
            "client count. The seed "
            "baseline is the seed 001 queue exactly as the article writes it (bench/seed_baseline.sql), in "
            "its own database; its rows hold only an id, no payload. W2 and W2b start from a preloaded, vacuumed "
            "backlog and count the tasks the database shows finished (history rows; status 2 for the seed). "
            "W3 and W4: 16 pgbench workers run the take-and-finish script, and a "
            "producer thread enqueues (in batches) as many tasks as they finished, so the backlog stays "
            "constant. In W3 the workers run as fast as they can, so throughput is their capacity. W4 "
            f"measures that capacity for a minute, soaks at a steady rate of {timeline.W4_LOAD:.0%} of it (pgbench --rate), "
            "then measures the capacity again. Samples read `pg_stat_user_tables` "
            "(finished tasks, dead tuples), `pg_table_size` and `pg_indexes_size`. Those counts lag by about "
            "a second of work, so each stretch's clock starts "
            f"{timeline.WARMUP_S:g} s after its workers, once the lag is steady; pgbench's own per-minute "
            "latency lines run that much ahead of it. A thread polls the cluster's processes every "
            f"{timeline.CpuWatch.EVERY:g} s (`/proc`, `pg_stat_activity`) and adds up, for each sample, the CPU "
            "of the backends, of autovacuum by table and of everything else, the idle time, and what the "
            "active backends wait on.", ""]
    out += ["## Targets (default durability, 16 clients unless said)", "",
            "| target | measured | met |", "|---|---|:-:|"]
    for name, measured, met in targets(results):
        out.append(f"| {name} | {measured} | {'–' if met is None else ('yes' if met else '**no**')} |")
    for p in results["passes"]:
        out += ["", f"## Jobs/s, pass: {p['name']}", "",
                "Each cell: jobs/s (ratio to the single-row INSERT ceiling at the same client count, "
                "the mean of its two measurements). "
                "`*`: the preloaded backlog ran out, a lower bound.", ""]
        out += points_table(p)
        for step, message in p.get("errors", {}).items():
            out += ["", f"**{step} failed** in this pass, so its numbers are missing:", "", "```", message, "```"]
        if p["timelines"].get("W3 skiplock") or p["timelines"].get("W3 seed"):
            out += ["", "## W3: MVCC pressure (an idle REPEATABLE READ transaction)", ""] + w3_tables(p)
        if p["timelines"].get("W4 skiplock"):
            out += ["", "## W4: soak", ""] + w4_tables(p)
    out += commit_cost(results)
    if chart:
        out += ["", "## W3 and W4 over time", "", f"![W3 and W4 over time]({chart})"]
    out += ["", f"Raw results: `{results['json']}` (bench/out/ is not committed).", ""]
    return "\n".join(out)


def summary_for_stdout(results: dict) -> str:
    lines = ["", "skiplock benchmark" + (" (development run)" if results["quick"] or results["only"] else ""), ""]
    for p in results["passes"]:
        lines += [f"pass: {p['name']}", ""] + points_table(p) + [""]
        for step, message in p.get("errors", {}).items():
            lines += [f"{step} FAILED: {message.splitlines()[0] if message else ''}", ""]
        if p["summaries"].get("W3 skiplock") or p["summaries"].get("W3 seed"):
            lines += ["W3"] + w3_tables(p, detail=False) + [""]
        if p["summaries"].get("W4 skiplock"):
            lines += ["W4"] + w4_tables(p) + [""]
    lines += ["targets:", ""]
    for name, measured, met in targets(results):
        lines.append(f"  [{'----' if met is None else ('met ' if met else 'MISS')}] {name}: {measured}")
    return "\n".join(lines)


def write_json(results: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=str))
