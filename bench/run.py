"""`make bench` (python -m bench.run): pgbench workloads against skiplock, the seed baseline and
the machine's ceiling, on throwaway clusters with PostgreSQL's default durability (and a second
pass with synchronous_commit=off). Progress goes to stderr, the results table to stdout, raw JSON
and the chart to bench/out/; a full run also writes bench/RESULTS.md and bench/w3_w4.png.

    python -m bench.run                       # everything: about 45 minutes on 2 cores
    python -m bench.run --quick               # short durations, for development (about 7 minutes)
    python -m bench.run --only W2,W3 --no-async-pass
    python -m bench.run --only seed004 --no-async-pass   # seed 004's design against skiplock alone
    python -m bench.run --only latency --no-async-pass   # enqueue-to-start at 10/50/90 % of capacity
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import psycopg

from bench import chart, designs, latency, pgbench, points, report, scale, seed004, timeline
from bench.designs import SEED, SKIPLOCK
from bench.progress import log
from skiplock import devdb

BENCH_DIR = Path(__file__).resolve().parent
OUT_DIR = BENCH_DIR / "out"
WORKLOADS = ("W1", "W1b", "W2", "W2b", "W3", "W4", "seed004", "latency", "scale")
# Both passes use the autovacuum_naptime the README recommends for a busy queue (1 s, cluster-wide);
# everything else is PostgreSQL's default, durability included.
RECOMMENDED = {"autovacuum_naptime": "'1s'"}
PASSES = (("default durability", dict(RECOMMENDED)),
          ("synchronous_commit=off", {**RECOMMENDED, "synchronous_commit": "off"}))
SETTINGS_SHOWN = ("fsync", "synchronous_commit", "full_page_writes", "wal_level", "shared_buffers",
                  "max_wal_size", "checkpoint_timeout", "autovacuum_naptime", "autovacuum_vacuum_scale_factor",
                  "autovacuum_vacuum_cost_limit", "jit")
# W2b preloads enough tasks for its expected rate (tasks/s) over the whole point, with a margin.
W2B_EXPECTED_RATE = 60_000


@dataclass
class Config:
    point_seconds: float = 20
    clients: tuple[int, ...] = (1, 4, 16)
    w2_preload: int = 300_000
    backlog: int = 30_000           # W3, W4: tasks kept waiting by the producer
    w3_before: float = 60
    w3_hold: float = 120
    w3_after: float = 90
    w3_sample: float = 10
    w4_seconds: float = 600
    w4_capacity_seconds: float = 60   # W4's unthrottled stretches before and after the soak
    w4_bucket: float = 60
    w4_sample: float = 10
    maintain_every: float = 5
    seed004_seconds: float = 10     # seed 004's insert points; its consume points run half as long
    latency_seconds: float = 10     # latency: capacity, then each load, this long
    scale_seconds: float = 30       # scale: each W1 and W2 cell (bench/scale.py), once, default durability

    @property
    def w2b_preload(self) -> int:
        return max(self.w2_preload, int(W2B_EXPECTED_RATE * self.point_seconds * 1.5))

    @classmethod
    def quick(cls) -> "Config":
        return cls(point_seconds=3, w2_preload=50_000, backlog=10_000, w3_before=20, w3_hold=30, w3_after=30,
                   w3_sample=5, w4_seconds=60, w4_capacity_seconds=20, w4_bucket=15, w4_sample=5,
                   maintain_every=2, seed004_seconds=3, latency_seconds=4, scale_seconds=3)

    def estimate_minutes(self, only: set[str], async_pass: bool) -> float:
        n = len(self.clients)
        per_pass = 3 * n * self.point_seconds + 15  # ceilings (INSERT twice), cluster, migrations
        if "W1" in only:
            per_pass += 3 * n * self.point_seconds
        if "W1b" in only:
            per_pass += n * self.point_seconds
        if "W2" in only:
            per_pass += 2 * n * (self.point_seconds + self.w2_preload / 40_000)
        if "W2b" in only:
            per_pass += n * (self.point_seconds + self.w2b_preload / 40_000)
        if "seed004" in only:
            per_pass += 2 * self.seed004_seconds + self.seed004_seconds + 60  # + tables and preloads
        if "latency" in only:
            per_pass += len(latency.LOOPS) * ((1 + 2 * len(latency.LOADS)) * (self.latency_seconds + 3) + 5)
        total = per_pass * (2 if async_pass else 1)
        if "W3" in only:
            total += 2 * (self.w3_before + self.w3_hold + self.w3_after + 10)
        if "W4" in only:
            total += self.w4_seconds + 2 * self.w4_capacity_seconds + 20
        if "scale" in only:  # seeding 10 M live and 50 M history rows dominates (bench/scale.py)
            total += 6 * 2 * self.scale_seconds + (300 if self.point_seconds < 10 else 2400)
        return total / 60


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="short durations (3 s a point, W3 80 s, W4 60 s) for developing the harness")
    parser.add_argument("--only", help=f"comma-separated workloads out of {','.join(WORKLOADS)} (ceilings always run)")
    parser.add_argument("--soak-minutes", type=float, help="W4 duration in minutes (default 10; 1 with --quick)")
    parser.add_argument("--no-async-pass", action="store_true", help="skip the synchronous_commit=off pass")
    parser.add_argument("--from-schema", action="store_true",
                        help="build skiplock from schema/ instead of its migrations (unreleased changes)")
    parser.add_argument("--publish", action="store_true",
                        help="write bench/RESULTS.md and bench/w3_w4.png even for a --quick or --only run")
    args = parser.parse_args(argv)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        unknown = [w for w in wanted if w not in WORKLOADS]
        if unknown:
            parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
        args.only = wanted
    return args


def cpu_busy(seconds: float = 2.0) -> float:
    """Share of CPU time other work used while we watched (before the benchmark starts anything)."""
    def read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields[:8]), idle
    total0, idle0 = read()
    time.sleep(seconds)
    total1, idle1 = read()
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def machine_facts() -> dict:
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    os_name = next((line.split("=", 1)[1].strip('"') for line in Path("/etc/os-release").read_text().splitlines()
                    if line.startswith("PRETTY_NAME=")), platform.system())
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": int(meminfo["MemTotal"].split()[0]) / 2**20,
        "os": f"{os_name}, kernel {platform.release()}",
        "loadavg": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
        "pgbench": pgbench.version(),
        "cpu_busy_before": cpu_busy(),
    }


def server_facts(cluster: devdb.Cluster) -> tuple[str, dict[str, str]]:
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        version = conn.execute("SELECT version()").fetchone()[0]
        settings = {name: conn.execute("SELECT current_setting(%s)", (name,)).fetchone()[0] for name in SETTINGS_SHOWN}
    return version, settings


def run_pass(name: str, settings: dict[str, str], cfg: Config, only: set[str], timelines: bool,
             from_schema: bool) -> tuple[dict, str]:
    """One cluster, every workload asked for. A workload that fails is reported and skipped."""
    log(f"pass {name}: starting a throwaway cluster")
    cluster = devdb.Cluster(durable=True, settings=settings).start()
    result: dict = {"name": name, "points": [], "timelines": {}, "summaries": {}, "errors": {}}
    seconds = cfg.point_seconds

    def ceilings() -> None:
        for c in cfg.clients:
            result["points"] += [p.as_dict() for p in points.ceilings(cluster, c, seconds)]

    def ceilings_again() -> None:
        for c in cfg.clients:
            result["points"] += [p.as_dict() for p in points.ceilings(cluster, c, seconds, again=True)]

    def w1() -> None:
        for design in (SKIPLOCK, SEED):
            for c in cfg.clients:
                result["points"].append(points.enqueue(cluster, design, c, seconds).as_dict())
        for c in cfg.clients:
            result["points"].append(points.enqueue(cluster, SKIPLOCK, c, seconds, waiting=True).as_dict())

    def w1b() -> None:
        for c in cfg.clients:
            result["points"].append(points.enqueue_batch(cluster, c, seconds).as_dict())

    def w2() -> None:
        for design in (SKIPLOCK, SEED):
            for c in cfg.clients:
                result["points"].append(points.process(cluster, design, c, seconds, cfg.w2_preload).as_dict())
        for c in cfg.clients:
            result["points"].append(points.process_combined(cluster, c, seconds, cfg.w2_preload).as_dict())
        for c in cfg.clients:
            result["points"].append(points.process_locked(cluster, c, seconds, cfg.w2_preload).as_dict())

    def w2b() -> None:
        for c in cfg.clients:
            result["points"].append(points.process_batch(cluster, c, seconds, cfg.w2b_preload).as_dict())

    def w3() -> None:
        hold = (cfg.w3_before, cfg.w3_before + cfg.w3_hold)
        for design in (SKIPLOCK, SEED):
            log(f"W3 {design.name}: {cfg.w3_before + cfg.w3_hold + cfg.w3_after:.0f} s")
            # skiplock runs its housekeeping as deployed (maintain() from cron or `skiplock maintain`);
            # the seed has none.
            tl = timeline.run(cluster, design, "W3", cfg.w3_before + cfg.w3_hold + cfg.w3_after,
                              cfg.w3_sample, cfg.backlog, hold=hold,
                              maintain_every=cfg.maintain_every if design is SKIPLOCK else None)
            result["timelines"][f"W3 {design.name}"] = tl.as_dict()
            result["summaries"][f"W3 {design.name}"] = timeline.w3_summary(tl)

    def w4() -> None:
        # Capacity (as fast as they can), then a steady rate below it for the soak, then capacity
        # again: one continuous stretch of work on the same tables, maintain() running throughout.
        common = dict(maintain_every=cfg.maintain_every)
        log(f"W4 skiplock: capacity for {cfg.w4_capacity_seconds:.0f} s, a soak of {cfg.w4_seconds / 60:.1f} min "
            f"at {timeline.W4_LOAD:.0%} of it, capacity again")
        before = timeline.run(cluster, SKIPLOCK, "W4", cfg.w4_capacity_seconds, cfg.w4_sample, cfg.backlog,
                              label="capacity", **common)
        rate = timeline.W4_LOAD * timeline.capacity(before)
        log(f"W4 skiplock: capacity {timeline.capacity(before):,.0f} jobs/s; soaking at {rate:,.0f} jobs/s")
        with psycopg.connect(cluster.url(SKIPLOCK.dbname), autocommit=True) as conn:
            planted = designs.plant_old_history(conn)
        if planted:
            log(f"W4 skiplock: for the soak's rotations to drop: {planted}")
            result.setdefault("notes", {})["W4 old history"] = planted
        soak = timeline.run(cluster, SKIPLOCK, "W4", cfg.w4_seconds, cfg.w4_sample, cfg.backlog, rate=rate,
                            fresh=False, progress_every=cfg.w4_bucket, **common)
        after = timeline.run(cluster, SKIPLOCK, "W4", cfg.w4_capacity_seconds, cfg.w4_sample, cfg.backlog,
                             fresh=False, label="capacity", **common)
        result["timelines"]["W4 skiplock"] = soak.as_dict()
        result["timelines"]["W4 capacity before"] = before.as_dict()
        result["timelines"]["W4 capacity after"] = after.as_dict()
        result["summaries"]["W4 skiplock"] = timeline.w4_summary(soak, cfg.w4_bucket, before, after, timeline.W4_LOAD)

    def s004() -> None:
        # Insert, then consume; the two designs in turn, at 16 clients (the issue's targets).
        # "bound": skiplock's statement with no function around it, the floor under its figure.
        for design in ("seed004", "skiplock", "bound"):
            result["points"].append(seed004.insert(cluster, design, cfg.seed004_seconds).as_dict())
        for design in ("seed004", "skiplock", "skiplock-drain", "skiplock-drain-none", "bound"):
            result["points"].append(seed004.consume(cluster, design, cfg.seed004_seconds / 2).as_dict())

    def lat() -> None:
        result["latency"] = {loop: latency.run(cluster, cfg.latency_seconds, loop=loop) for loop in latency.LOOPS}

    steps = [("ceilings", ceilings), ("W1", w1), ("W1b", w1b), ("W2", w2), ("W2b", w2b),
             ("ceilings again", ceilings_again), ("seed004", s004), ("latency", lat)]
    if timelines:
        steps += [("W3", w3), ("W4", w4)]
    try:
        designs.create_databases(cluster.url(), cluster.url, from_schema)
        if "seed004" in only:
            seed004.create_database(cluster)
        version, result["settings"] = server_facts(cluster)
        for step, run_step in steps:
            if not step.startswith("ceilings") and step not in only:
                continue
            try:
                run_step()
            except (RuntimeError, psycopg.Error) as e:
                message = str(e).strip()
                result["errors"][step] = message
                log(f"{step} FAILED, going on without it: {message.splitlines()[0] if message else type(e).__name__}")
    finally:
        cluster.stop()
        log(f"pass {name}: cluster stopped")
    return result, version


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    cfg = Config.quick() if args.quick else Config()
    if args.soak_minutes:
        cfg.w4_seconds = args.soak_minutes * 60
    only = set(args.only or WORKLOADS)
    passes = PASSES[:1] if args.no_async_pass else PASSES
    started = datetime.now(timezone.utc)
    began = time.monotonic()
    log(f"estimated duration: about {cfg.estimate_minutes(only, not args.no_async_pass):.0f} min")
    results: dict = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": "make bench" + (f" BENCH_ARGS={shlex.quote(' '.join(argv))}" if argv else "")
                   + f"    # = .venv/bin/python -m bench.run {' '.join(argv)}".rstrip(),
        "quick": args.quick,
        "only": args.only or [],
        "from_schema": args.from_schema,
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__} | {"w2b_preload": cfg.w2b_preload},
        "machine": machine_facts(),
        "passes": [],
    }
    with devdb.stopped_on_signals():
        for i, (name, settings) in enumerate(passes):
            result, version = run_pass(name, settings, cfg, only, timelines=(i == 0), from_schema=args.from_schema)
            results["passes"].append(result)
            results["machine"]["postgres"] = version
    results["finished"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    m = results["machine"]
    m["loadavg_end"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    results["elapsed_min"] = (time.monotonic() - began) / 60

    stamp = started.strftime("%Y%m%d-%H%M%S")
    json_path = OUT_DIR / f"results-{stamp}.json"
    results["json"] = str(json_path.relative_to(BENCH_DIR.parent))
    report.write_json(results, json_path)
    shutil.copyfile(json_path, OUT_DIR / "latest.json")
    has_chart = chart.draw(results["passes"][0], OUT_DIR / "w3_w4.png",
                           f"skiplock, {results['started']}, {results['machine']['nproc']} CPUs, default durability")
    markdown = report.markdown(results, "w3_w4.png" if has_chart else None)
    (OUT_DIR / "RESULTS.md").write_text(markdown)
    publish = args.publish or not (args.quick or args.only)
    if publish:
        (BENCH_DIR / "RESULTS.md").write_text(markdown)
        if has_chart:
            shutil.copyfile(OUT_DIR / "w3_w4.png", BENCH_DIR / "w3_w4.png")
    lat_passes = [(f"{p['name']}, {loop} loop", r) for p in results["passes"] for loop, r in p.get("latency", {}).items()]
    if lat_passes:
        # Its own file, written whenever the part ran (--only latency included; a --quick run only into
        # bench/out/): bench/LATENCY.md keeps the latest measurement, a section a pass.
        text = "# Latency: enqueue to start\n\n" + latency.markdown(
            lat_passes, results["started"],
            f"{m['nproc']} CPUs, {m['postgres'].split(' on ')[0]}, load average "
            f"{m['loadavg']} at the start and {m['loadavg_end']} at the end") \
            + f"\nWritten by `{results['command'].split('    #')[0]}`; raw figures in `{results['json']}`.\n"
        (OUT_DIR / "LATENCY.md").write_text(text)
        if not args.quick:
            (BENCH_DIR / "LATENCY.md").write_text(text)
        log("latency: " + ("bench/out/LATENCY.md" if args.quick else "bench/LATENCY.md"))
    if "scale" in only:
        # Its own databases on its own cluster, default durability only; a section of RESULTS.md.
        sizes = (([10_000, 100_000], [100], 200_000) if args.quick
                 else ([10_000, 1_000_000, 10_000_000], [1_000, 100_000], 50_000_000))
        live, stage_counts, history = sizes
        scaled = scale.run(live, stage_counts, history, 16, cfg.scale_seconds)
        scale.write(scaled, 16, cfg.scale_seconds, results=(BENCH_DIR if publish else OUT_DIR) / "RESULTS.md")
    print(report.summary_for_stdout(results))
    where = "bench/RESULTS.md" if publish else "bench/out/RESULTS.md (development run: bench/RESULTS.md left as it was)"
    log(f"done in {results['elapsed_min']:.1f} min: {where}, {results['json']}"
        + (", chart w3_w4.png" if has_chart else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
