"""Sizing a backfill (issue 35): what a year of daily partitions takes on a cluster, predicted by
:mod:`emr_ray.sizing.model` from measured per-task costs, and checked against real local backfills.

**Measured inputs** (``--measure``, or ``--results PATH`` to reuse a measurement): on a warm local stack
(``devstack.stack.LocalStack``, PostgreSQL for the live Airflow), ``bench.pipeline.measure_size`` runs
the tabular DAG once per ``--sizes`` row count (``airflow dags test``, the real operators) and
:func:`emr_ray.sizing.model.costs_from_sizes` fits each task's seconds, each Ray job's wall and CPU- and
GPU-seconds over the sizes. Around each run :class:`HostCpu` counts the CPU-seconds of every process of
this loopback namespace (Airflow, Ray, Spark's JVM, MLflow, the COS stand-in). Then a short
calibration backfill (``--calibrate-days``, ``bench.pipeline.backfill``: a live Airflow, the DAG's
pools and ``max_active_runs``) gives what ``dags test`` cannot show (:func:`emr_ray.sizing.model.calibrate`):
the machine's CPU-seconds per partition when Airflow runs each task in a process of its own, and
Airflow's gaps between a partition's tasks.

**Check** (``--check``): after measuring, predict and then run a backfill of ``--backfill-days`` x
``--backfill-rows`` on the one-node local cluster (the ``--cpus`` head, as ``bench.pipeline`` does) and
on two nodes (a second local Ray node of ``--worker-cpus`` joined to the head,
``devstack.ray_head.add_worker_node``, as ``bench/chaos.py`` does; the pools sized for both), and
print prediction, measurement and error. The prediction uses the cores that other processes of the
machine left free in the run before it; the hindsight figure, those they left during the run itself
(on a shared machine the largest source of error). Results: ``bench/results/sizing-check.json``.

**Shapes** (``--shapes``): the prediction for a 365-day backfill at 200,000 and 10,000,000 rows per
partition on three example Tencent Cloud EMR shapes, as a markdown table; ``--shape 4x16,2x8:1`` adds
your own. The same table ships in the provider: ``python -m emr_ray.sizing`` (no servers, no bench/).

Run inside the loopback-only namespace (measuring starts servers; ``--shapes`` alone starts none)::

    bash scripts/loopback.sh .venv/bin/python -m bench.sizing --check                 # ~30 min here
    .venv/bin/python -m bench.sizing --shapes --results bench/results/sizing-check.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench._common import REPO, RESULTS, STATE, machine, machine_busy_cpu_s, table, write_json
from emr_ray.sizing.model import (
    Cluster,
    Costs,
    Nodes,
    Prediction,
    Settings,
    calibrate,
    costs_from_sizes,
    predict,
)
from emr_ray.sizing.shapes import EXAMPLE_SHAPES, load_costs, parse_shape, shapes_for, shapes_table  # noqa: F401

#: where --shapes looks for measured costs when no --results is given, first found
DEFAULT_RESULTS = ("sizing-check.json", "sizing-measure.json", "pipeline-sizes.json", "pipeline.json")
CONTENDER = "warm_defer_at_once"  # the DAGs' defaults: warm pools, deferring at once


# -- measuring the machine's CPU --------------------------------------------------------------------
class HostCpu:
    """CPU-seconds of every process in this process's network namespace (the loopback-only one that
    ``scripts/loopback.sh`` makes: the stack, Airflow, Ray, this process), and the cores the machine's
    other processes kept busy meanwhile. Sampled from ``/proc`` every ``interval`` seconds: the last
    fraction of an interval of a process that exits is missed, so the figure is a lower bound."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.tick = os.sysconf("SC_CLK_TCK")
        self.netns = os.readlink("/proc/self/ns/net")
        self.samples: list[tuple[float, float, float]] = []  # (epoch s, our CPU-s, machine busy CPU-s)
        self._first: dict[tuple[int, int], int] = {}
        self._last: dict[tuple[int, int], int] = {}
        self._member: dict[tuple[int, int], bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-cpu", daemon=True)

    def __enter__(self) -> HostCpu:
        with open("/proc/uptime") as f:
            self._born_after = int(float(f.read().split()[0]) * self.tick)  # ticks since boot
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                key = (
                    int(entry.name),
                    int(fields[19]),
                )  # pid and start time: a reused pid is another process
                if key not in self._member:
                    self._member[key] = os.readlink(f"/proc/{entry.name}/ns/net") == self.netns
            except (OSError, IndexError, ValueError):
                continue  # gone, or not ours to read
            if self._member[key]:
                ticks = int(fields[11]) + int(fields[12])  # utime + stime
                # a process started since the meter began counts from zero
                self._first.setdefault(key, 0 if key[1] >= self._born_after else ticks)
                self._last[key] = ticks
        ours = sum(self._last[k] - self._first[k] for k in self._last) / self.tick
        self.samples.append((time.time(), ours, machine_busy_cpu_s()))

    def result(self, start: float | None = None, end: float | None = None) -> dict[str, float]:
        """Our CPU-seconds and the others' busy cores from ``start`` to ``end`` (epoch seconds; default:
        the whole measurement), between the samples nearest them."""
        inside = [
            s for s in self.samples if (start is None or s[0] >= start) and (end is None or s[0] <= end)
        ]
        first, last = (inside[0], inside[-1]) if len(inside) > 1 else (self.samples[0], self.samples[-1])
        wall = max(last[0] - first[0], 1e-9)
        ours, busy = last[1] - first[1], last[2] - first[2]
        return {"cpu_s": round(ours, 1), "wall_s": round(wall, 1), "cores_used": round(ours / wall, 2),
                "others_busy_cores": round(max(busy - ours, 0.0) / wall, 2),
                "machine_cores": os.cpu_count() or 1}  # fmt: skip


def free_cores(host: dict[str, float]) -> float:
    """The cores a measurement's other processes left to this stack (at least a tenth of one)."""
    return max(host["machine_cores"] - host["others_busy_cores"], 0.1)


# -- local clusters and the live runs ---------------------------------------------------------------
def local_cluster(head_cpus: float, worker_cpus: float | None, host_cores: float) -> Cluster:
    nodes = [Nodes(1, head_cpus, kind="head")] + (
        [Nodes(1, worker_cpus, kind="worker")] if worker_cpus else []
    )
    name = (
        f"local {len(nodes)} node(s), {sum(n.cpus for n in nodes):g} Ray CPUs on {host_cores:.1f} free cores"
    )
    return Cluster(tuple(nodes), host_cores=host_cores, name=name)


def local_settings(cluster: Cluster, conf: dict[str, Any]) -> Settings:
    """The live Airflow's settings as ``bench.pipeline.backfill`` runs it: the DAG's ``max_active_runs``,
    the LocalExecutor's slots, the pools ``bench.pipeline.pool_slots`` sizes for the contender."""
    from bench.pipeline import pool_slots
    from devstack.airflow import PARALLELISM

    warm = conf.get("spark_session") == "shared"
    return Settings(airflow_slots=PARALLELISM, warm=warm, pool_slots=pool_slots(cluster.cpus, conf))


def run_backfill(
    stack, days: int, rows: int, first: dt.date, conf: dict[str, Any], cpus: float
) -> dict[str, Any]:
    """``bench.pipeline.backfill`` of fresh partitions, with the machine's CPU over its wall."""
    from bench.pipeline import backfill
    from include.data import synthetic

    synthetic.write_partitions(stack.raw_uri, first.isoformat(), days, rows, stack.storage_options())
    with HostCpu() as meter:
        measured = backfill(stack, days, rows, first, conf, cpus=cpus)
    measured["host"] = meter.result(measured["started_at"], measured["ended_at"])
    return measured


def measure(stack, args: argparse.Namespace, result: dict[str, Any]) -> tuple[Costs, dt.date]:
    """Per-size runs, their costs, then the calibration backfill; returns the costs and the next free date."""
    from bench.pipeline import CONTENDERS, FIRST_SIZE_DATE, WARMUP_DATE, WARMUP_ROWS, dags_test, measure_size
    from include.data import synthetic

    conf = CONTENDERS[args.contender]
    env = os.environ | stack.dags_test_env()
    subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    options = stack.storage_options()
    if not args.no_warmup:  # the first run starts the warm pools: not a partition's cost
        synthetic.write_partitions(stack.raw_uri, WARMUP_DATE, 1, WARMUP_ROWS, options)
        result["warmup_s"] = round(dags_test(stack, WARMUP_DATE, conf)[0], 1)
        print(f"sizing: warm-up run {result['warmup_s']} s", flush=True)
    day, sizes = FIRST_SIZE_DATE, []
    for rows in args.sizes:
        synthetic.write_partitions(stack.raw_uri, day.isoformat(), 1, rows, options)
        with HostCpu() as meter:
            measured = measure_size(stack, rows, day.isoformat(), conf)
        measured["host"] = meter.result()
        sizes.append(measured)
        print(f"sizing: {rows:,} rows, dags test {measured['dags_test_s']} s, {measured['host']['cpu_s']} CPU-s "
              f"on this machine", flush=True)  # fmt: skip
        day += dt.timedelta(days=1)
    result["sizes"] = sizes
    costs = costs_from_sizes(
        sizes, source=f"bench.sizing --measure, {args.contender}, {time.strftime('%Y-%m-%d')}"
    )
    result["costs_dags_test"] = costs.to_dict()
    if args.calibrate_days:
        rows = args.calibrate_rows or args.backfill_rows
        measured = run_backfill(stack, args.calibrate_days, rows, day, conf, float(stack.num_cpus))
        day += dt.timedelta(days=args.calibrate_days + 1)
        costs = calibrated(costs, measured, stack.num_cpus, conf)
        result["calibration"] = {"backfill": measured, "gaps": dataclasses.asdict(costs.gaps),
                                 "host_cpu_s": dataclasses.asdict(costs.host_cpu_s) if costs.host_cpu_s else None}  # fmt: skip
        print(f"sizing: calibration backfill {args.calibrate_days} x {rows:,} rows {measured['wall_s']} s: gaps "
              f"{costs.gaps.fixed} s per partition, {costs.host_cpu_s.fixed if costs.host_cpu_s else '-'} CPU-s "
              f"per partition on this machine", flush=True)  # fmt: skip
    result["costs"] = costs.to_dict()
    return costs, day


def calibrated(costs: Costs, measured: dict[str, Any], head_cpus: float, conf: dict[str, Any]) -> Costs:
    """The costs calibrated on a one-node backfill that :func:`run_backfill` measured."""
    cluster = local_cluster(head_cpus, None, free_cores(measured["host"]))
    return calibrate(costs, cluster, local_settings(cluster, conf), partitions=measured["days"], rows=measured["rows"],
                     wall_s=measured["wall_s"], host_cpu_s=measured["host"]["cpu_s"])  # fmt: skip


def check(
    stack, costs: Costs, args: argparse.Namespace, first: dt.date, last_host: dict[str, float]
) -> list[dict]:
    """Predict, then run, the backfill on one node and on two; each prediction before its run."""
    from bench.pipeline import CONTENDERS
    from devstack.ray_head import add_worker_node

    conf = CONTENDERS[args.contender]
    checks: list[dict[str, Any]] = []
    for nodes in args.nodes:
        worker = args.worker_cpus if nodes == 2 else None
        if worker and not any(c["nodes"] == 2 for c in checks):
            add_worker_node(stack.ray, num_cpus=worker)
        cluster = local_cluster(stack.num_cpus, worker, free_cores(last_host))
        before = predict(costs, cluster, local_settings(cluster, conf), partitions=args.backfill_days,
                         rows=args.backfill_rows)  # fmt: skip
        print(f"sizing: predicted before the run\n{before.explain()}", flush=True)
        measured = run_backfill(stack, args.backfill_days, args.backfill_rows, first, conf, cluster.cpus)
        first += dt.timedelta(days=args.backfill_days + 1)
        last_host = measured["host"]
        checks.append(compared(costs, cluster, conf, nodes, before, measured))
        print(f"sizing: {nodes} node(s): predicted {before.wall_s:.0f} s, measured {measured['wall_s']:.0f} s "
              f"({checks[-1]['error_pct']:+.0f}%)", flush=True)  # fmt: skip
    return checks


def compared(
    costs: Costs,
    cluster: Cluster,
    conf: dict[str, Any],
    nodes: int,
    before: Prediction,
    measured: dict[str, Any],
) -> dict[str, Any]:
    """A check's record: the prediction made before the run, the measurement, their error, and the
    hindsight prediction with the cores the machine's other processes left free during the run."""
    during = dataclasses.replace(cluster, host_cores=free_cores(measured["host"]))
    hindsight = predict(
        costs, during, local_settings(during, conf), partitions=before.partitions, rows=before.rows
    )
    return {"nodes": nodes, "cluster": dataclasses.asdict(cluster), "prediction": before.to_dict(),
            "hindsight": hindsight.to_dict(), "measured": measured,
            "error_pct": error_pct(before.wall_s, measured["wall_s"]),
            "hindsight_error_pct": error_pct(hindsight.wall_s, measured["wall_s"])}  # fmt: skip


def error_pct(predicted: float, measured: float) -> float:
    return round(100 * (predicted - measured) / measured, 1)


# -- output -----------------------------------------------------------------------------------------
def check_table(checks: list[dict[str, Any]]) -> str:
    rows = []
    for c in checks:
        p, h, m = c["prediction"], c["hindsight"], c["measured"]
        host = p["host_cpu_hours"]
        rows.append([
            f"{c['nodes']} node(s), {p['cluster_cpus']:g} Ray CPUs, pools {p['pool_slots']}",
            f"{m['days']} x {m['rows']:,}", f"{p['wall_s']:.0f} s", f"{m['wall_s']:.0f} s", f"**{c['error_pct']:+.0f}%**",
            p["bottleneck"], f"{h['wall_s']:.0f} s ({c['hindsight_error_pct']:+.0f}%)",
            f"{p['cpu_utilisation']:.0%} / {m['utilisation']:.0%}",
            f"{host * 3600 / p['partitions'] if host else 0:.0f} / {m['host']['cpu_s'] / m['days']:.0f}",
            f"{m['host']['others_busy_cores']:.2f}",
        ])  # fmt: skip
    headers = ["local cluster", "partitions x rows", "predicted", "measured", "error", "predicted bottleneck",
               "hindsight (error)", "utilisation predicted / measured", "machine CPU-s per partition predicted / measured",
               "others' busy cores during it"]  # fmt: skip
    return table(headers, rows)


def find_results(given: str | None) -> Path:
    if given:
        return Path(given)
    for name in DEFAULT_RESULTS:
        if (RESULTS / name).exists():
            return RESULTS / name
    raise SystemExit(
        f"no measured costs in {RESULTS} ({', '.join(DEFAULT_RESULTS)}): run --measure, or give --results"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = parser.add_argument_group("what to do (any of them)")
    mode.add_argument("--measure", action="store_true", help="measure the costs on a local stack")
    mode.add_argument(
        "--check", action="store_true", help="measure, then predict and run the local backfills"
    )
    mode.add_argument("--shapes", action="store_true", help="the example EMR shapes' table")
    mode.add_argument(
        "--shape", action="append", default=[], help="a shape of your own: COUNTxCPUS[:GPUS],..."
    )
    parser.add_argument("--results", help=f"measured costs to predict from (default: the first of "
                        f"{', '.join(DEFAULT_RESULTS)} in bench/results)")  # fmt: skip
    parser.add_argument("--contender", default=CONTENDER, help="the DAG's path (bench.pipeline.CONTENDERS)")
    parser.add_argument("--sizes", default="20000,200000,1000000", help="rows per partition to measure")
    parser.add_argument("--cpus", type=int, default=3, help="CPUs of the local Ray head")
    parser.add_argument("--no-warmup", action="store_true", help="skip the 2,000-row warm-up run")
    parser.add_argument(
        "--calibrate-days", type=int, default=3, help="partitions of the calibration backfill (0: none)"
    )
    parser.add_argument("--calibrate-rows", type=int, default=0, help="its rows (default --backfill-rows)")
    parser.add_argument("--backfill-days", type=int, default=10, help="partitions of each checked backfill")
    parser.add_argument("--backfill-rows", type=int, default=200_000)
    parser.add_argument(
        "--nodes", default="1,2", help="the checked local clusters: 1 (the head), 2 (and a worker)"
    )
    parser.add_argument("--worker-cpus", type=int, default=3, help="CPUs of the second node")
    parser.add_argument("--shape-days", type=int, default=365)
    parser.add_argument("--shape-rows", default="200000,10000000")
    args = parser.parse_args(argv)
    if not (args.measure or args.check or args.shapes or args.shape):
        parser.error("say what to do: --measure, --check, --shapes or --shape")
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    args.nodes = [int(n) for n in args.nodes.split(",") if n.strip()]
    if (args.measure or args.check) and len(set(args.sizes)) < 2:
        parser.error("--sizes: give two sizes or more (the fit separates fixed seconds from seconds per row)")
    if set(args.nodes) - {1, 2}:
        parser.error("--nodes: 1, 2 or 1,2")

    costs = None
    if args.measure or args.check:
        costs = measure_and_check(args, {"machine": machine(), "args": vars(args)})
    if args.shapes or args.shape:
        try:
            shapes = shapes_for(args.shape, args.shapes)
            costs = costs or load_costs(find_results(args.results), args.contender)
        except ValueError as e:
            parser.error(str(e))
        rows = [int(r) for r in args.shape_rows.split(",") if r.strip()]
        text = shapes_table(costs, shapes, args.shape_days, rows)
        print(f"\nmeasured costs: {costs.source}\n\n{text}")


def measure_and_check(args: argparse.Namespace, result: dict[str, Any]) -> Costs:
    from bench.pipeline import use_contender
    from devstack.stack import LocalStack

    root = STATE / "sizing"
    shutil.rmtree(root, ignore_errors=True)  # each run starts from an empty stack
    started = time.monotonic()
    use_contender(args.contender)
    stack = LocalStack(root, REPO, num_cpus=args.cpus, postgres=True).start()
    try:
        costs, day = measure(stack, args, result)
        write_json("sizing-measure.json", result)
        if args.check:
            last = (
                result.get("calibration", {}).get("backfill", {}).get("host") or result["sizes"][-1]["host"]
            )
            result["checks"] = check(stack, costs, args, day, last)
    finally:
        stack.stop()
    result["total_s"] = round(time.monotonic() - started, 1)
    if args.check:
        result["table"] = check_table(result["checks"])
        path = write_json("sizing-check.json", result)
        print(f"\n{result['table']}\n\nwritten {path} in {result['total_s']} s")
    return costs


if __name__ == "__main__":
    main()
