"""The chaos soak: a backfill of the tabular DAG on the production topology under a seeded fault
schedule, the same backfill without faults for the ratio, then the audit.

The topology: Airflow on PostgreSQL with the CeleryExecutor (Redis broker, two Celery workers, each its
own process group), scheduler, triggerer, DAG processor, API server; a two-node Ray cluster (head and
a worker node, :func:`devstack.ray_head.add_worker_node`); the Jobs API and the COS stand-in each
behind a fault proxy (:mod:`devstack.fault_proxy`), which the ``ray_default`` and ``cos_default``
connections point at; the MLflow server (on PostgreSQL), which ``mlflow_default`` points at. The Ray
pools are sized for the cluster's CPUs (:func:`emr_ray.sizing.model.ray_pool_slots`).

The run: ``--partitions`` raw partitions of ``--rows`` rows for the clean backfill and as many other
dates for the faulted one. A one-date warm-up backfill starts the warm pools, so that neither pays
for them; then the clean backfill runs; its wall time is the span over which the ``--faults``
faults are drawn from ``--seed`` (:mod:`devstack.chaos_schedule`; printed, and the same seed gives the
same faults at the same points) and injected during the faulted backfill (:mod:`devstack.chaos_faults`,
logged to ``chaos-<seed>-faults.jsonl``). Both backfills are raced alike, so that the ratio is the
faults' alone: ``--reruns`` manual runs of their own dates, and ``--arrivals`` raw partitions of
later dates landing in COS while they run, each found by ``retrain_on_arrival``'s asset watcher
(through the COS fault proxy) and run by it. A wall time is the backfill's start to the end of its
last run, arrivals' and reruns' included. How Airflow recovered the task of each killed Celery
worker (its try at the kill, its last try and state) is reported. When the warm pools have had
their idle time, the audit (:mod:`emr_ray.audit`) checks every date and prints its table; the soak
exits with the audit's code. Figures go to ``bench/results/chaos-<seed>.json``.

Everything lives under ``.state/bench/chaos`` (removed at start). Run inside the loopback namespace::

    bash scripts/loopback.sh .venv/bin/python -m bench.chaos --partitions 30 --faults 12 --seed 33
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from bench._common import REPO, STATE, machine, write_json
from devstack.chaos_schedule import KINDS, draw
from devstack.ports import free_port

DAG_ID = "retrain_tabular"
#: small data and one epoch on one worker: seconds of work per partition, the rest is the platform
CHEAP = {"epochs": 1, "num_workers": 1}
#: the warm pools' idle timeout in the soak (the DAGs' Variables), so the audit need not wait 10 min
WARM_IDLE_S = 30
FIRST_DATE = dt.date(2026, 6, 1)
#: the DAG that runs a partition when its ``_SUCCESS`` lands (its asset watcher), and the Variable
#: whose conf its runs get
WATCHER_DAG_ID = "retrain_on_arrival"
ARRIVAL_CONF_VARIABLE = "emr_ray_arrival_conf"
#: seconds per date of a clean backfill here (2,000 rows, warm): reruns and arrivals are spread over
#: the first 60% of ``RACE_S_PER_DATE x --partitions`` (or ``--span-s``), alike in both backfills
RACE_S_PER_DATE = 14.0


def backfill(
    api: Any,
    dates: list[str],
    conf: dict[str, Any],
    timeout: float,
    race: Callable[[], list[str]] | None = None,
) -> dict[str, Any]:
    """One backfill over ``dates`` through the REST API, waited for with the runs ``race`` starts
    while it runs (it returns their run ids); the wall time to the last run's end and the states."""
    from devstack.airflow_client import backfill_runs, wait_for_runs
    from emr_ray.params import MAX_ACTIVE_RUNS

    raced: list[str] = []
    racer = (
        threading.Thread(target=lambda: raced.extend(race()), name="chaos-race", daemon=True)
        if race
        else None
    )
    body = {"dag_id": DAG_ID, "from_date": f"{dates[0]}T00:00:00Z", "to_date": f"{dates[-1]}T00:00:00Z",
            "reprocess_behavior": "completed", "max_active_runs": MAX_ACTIVE_RUNS, "dag_run_conf": conf}  # fmt: skip
    started = time.monotonic()
    created = api.call("POST", "/api/v2/backfills", body)
    if racer is not None:
        racer.start()
    runs = list(backfill_runs(api, dates).values())
    finished = wait_for_runs(api, {r["dag_run_id"] for r in runs}, timeout=timeout)
    if racer is not None:
        racer.join(timeout=timeout)
        finished |= wait_for_runs(api, set(raced), timeout=timeout) if raced else {}
    wall = time.monotonic() - started
    try:  # its runs are done; the next backfill needs it closed
        api.call("PUT", f"/api/v2/backfills/{created['id']}/cancel", retries=1)
    except AssertionError:
        pass
    backfilled = {r["dag_run_id"] for r in runs}
    return {"dates": dates, "wall_s": round(wall, 1),
            "states": sorted(r["state"] for rid, r in finished.items() if rid in backfilled),
            "raced": {rid: finished[rid]["state"] for rid in raced}}  # fmt: skip


def manual_reruns(
    api: Any, seed: int, dates: list[str], count: int, span_s: float, tag: str = ""
) -> list[dict[str, Any]]:
    """Trigger ``count`` manual runs of seeded dates among ``dates`` at seeded seconds within
    ``span_s`` (from now), racing the backfill's runs of the same dates; returns them as triggered."""
    rng = random.Random(f"reruns-{seed}")
    plan = sorted((round(rng.uniform(0.1, 0.6) * span_s, 1), rng.choice(dates)) for _ in range(count))
    started, triggered = time.monotonic(), []
    for i, (at_s, date) in enumerate(plan):
        time.sleep(max(0.0, started + at_s - time.monotonic()))
        run_id = f"manual__chaos-{seed}{tag}-{i}-{date}"
        api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns",
                 {"dag_run_id": run_id, "logical_date": None, "conf": CHEAP | {"partition": date}})  # fmt: skip
        triggered.append({"at_s": at_s, "date": date, "run_id": run_id})
        print(f"chaos: manual rerun {run_id} at {at_s:.0f} s", flush=True)
    return triggered


def arrivals(
    api: Any, stack: Any, seed: int, dates: list[str], span_s: float, rows: int, timeout: float = 600
) -> list[dict[str, Any]]:
    """Land the raw partitions of ``dates`` in COS at seeded seconds within ``span_s`` (from now),
    each as a producer does (data files, then ``_SUCCESS``); ``retrain_on_arrival``'s watcher finds
    each and triggers a run of it. Returns each date with the ``retrain_tabular`` run that took it."""
    from include.data import synthetic

    rng = random.Random(f"arrivals-{seed}")
    plan = sorted(round(rng.uniform(0.1, 0.6) * span_s, 1) for _ in dates)
    started, landed = time.monotonic(), []
    for at_s, date in zip(plan, dates, strict=True):
        time.sleep(max(0.0, started + at_s - time.monotonic()))
        synthetic.write_partitions(stack.raw_uri, date, 1, rows, stack.storage_options())
        landed.append({"at_s": at_s, "date": date})
        print(f"chaos: partition {date} landed at {at_s:.0f} s", flush=True)
    deadline = time.monotonic() + timeout
    while True:  # the watcher's run triggers the date's run (Airflow 3.1's operator_triggered), with the Variable's conf
        runs = api.runs("&run_type=operator_triggered&run_type=manual")
        taken = {(r.get("conf") or {}).get("partition"): r["dag_run_id"] for r in runs}
        if all(d["date"] in taken for d in landed):
            return [d | {"run_id": taken[d["date"]]} for d in landed]
        assert time.monotonic() < deadline, (
            f"no run took {[d['date'] for d in landed if d['date'] not in taken]}"
        )
        time.sleep(2)


def wait_until_quiet(stack: Any, quiet_s: float, timeout: float = 900) -> None:
    """Until no Ray job has run for ``quiet_s`` (the warm pools' idle timeout and lease timeout)."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        request = urllib.request.Request(f"{stack.ray.dashboard_url}/api/jobs/",
                                         headers={"Authorization": f"Bearer {stack.ray.token}"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            jobs = json.loads(response.read())
        if not any(j["status"] in ("PENDING", "RUNNING") for j in jobs):
            last = max((j.get("end_time") or 0) / 1000 for j in jobs) if jobs else 0
            if time.time() - last >= quiet_s:
                return
        time.sleep(5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=30, help="dates per backfill (clean and faulted)")
    parser.add_argument("--faults", type=int, default=12)
    parser.add_argument(
        "--seed", type=int, default=None, help="the fault schedule's seed (default: drawn, printed)"
    )
    parser.add_argument("--rows", type=int, default=2000, help="rows per raw partition")
    parser.add_argument("--kinds", default=",".join(KINDS), help="the fault kinds to draw from")
    parser.add_argument(
        "--reruns", type=int, default=2, help="manual runs of each backfill's own dates racing it"
    )
    parser.add_argument("--arrivals", type=int, default=3,
                        help="partitions of later dates landing in COS while each backfill runs")  # fmt: skip
    parser.add_argument("--span-s", type=float, default=None,
                        help="seconds to spread the faults over (default: the clean backfill's wall time)")  # fmt: skip
    parser.add_argument("--no-clean", action="store_true", help="skip the clean backfill (give --span-s)")
    parser.add_argument("--timeout-s", type=float, default=4 * 3600, help="per backfill")
    args = parser.parse_args(argv)
    if args.no_clean and not args.span_s:
        parser.error("--no-clean needs --span-s")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    draw(seed, args.faults, 100, kinds)  # refuses unknown kinds before anything starts
    print(f"chaos: seed {seed}", flush=True)

    from devstack.airflow import LocalAirflow, ray_pool_slots
    from devstack.airflow_client import Api
    from devstack.chaos_faults import Injector, task_finder, worker_recoveries
    from devstack.fault_proxy import FaultProxy
    from devstack.ray_head import add_worker_node
    from devstack.stack import LocalStack
    from emr_ray.audit import cli as audit
    from include.data import synthetic

    root = STATE / "chaos"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    n = args.partitions
    warmup_dates = [(FIRST_DATE - dt.timedelta(days=1)).isoformat()]
    clean_dates = [(FIRST_DATE + dt.timedelta(days=i)).isoformat() for i in range(n)]
    fault_dates = [(FIRST_DATE + dt.timedelta(days=n + i)).isoformat() for i in range(n)]
    # the partitions that land during each backfill (their raw data is written only then)
    a = args.arrivals
    clean_arrivals = [(FIRST_DATE + dt.timedelta(days=2 * n + i)).isoformat() for i in range(a)]
    fault_arrivals = [(FIRST_DATE + dt.timedelta(days=2 * n + a + i)).isoformat() for i in range(a)]
    fault_log = root / f"chaos-{seed}-faults.jsonl"
    fault_log.touch()
    result: dict[str, Any] = {
        "seed": seed,
        "machine": machine(),
        "partitions": n,
        "rows": args.rows,
        "conf": CHEAP,
    }
    began = time.monotonic()
    stack = LocalStack(root, REPO, num_cpus=2, postgres=True, mlflow_on_postgres=True, redis=True,
                       mlflow_ui_port=free_port(), warm_idle_timeout=WARM_IDLE_S)  # fmt: skip
    airflow = jobs_proxy = cos_proxy = injector = None
    try:
        stack.start()
        assert stack.ray is not None
        jobs_proxy = FaultProxy(stack.ray.dashboard_url).start()
        cos_proxy = FaultProxy(f"http://{stack.cos.endpoint}", keep_host=True).start()
        stack.connection_overrides = {
            "ray_default": {"host": jobs_proxy.url},
            "cos_default": {"extra": {"endpoint": f"127.0.0.1:{cos_proxy.port}"}},
            "mlflow_default": {"host": stack.mlflow_ui_url},
        }
        add_worker_node(stack.ray, num_cpus=1)
        cpus = stack.num_cpus + 1
        synthetic.write_partitions(
            stack.raw_uri, warmup_dates[0], 2 * n + 1, args.rows, stack.storage_options()
        )
        airflow = LocalAirflow(stack, root / "airflow-home", port=free_port(), executor="CeleryExecutor",
                               pool_slots=ray_pool_slots(cpus), health_check_s=15, retry_delay_s=10,
                               task_heartbeat_timeout_s=60, watch_interval_s=5)  # fmt: skip
        airflow.start()
        api = Api(airflow)
        api.unpause_once_parsed(DAG_ID, timeout_s=300)  # once the DAG processor parsed it
        # the watcher's first listing takes what is there as history: only the arrivals are news
        api.call("POST", "/api/v2/variables", {"key": ARRIVAL_CONF_VARIABLE, "value": json.dumps(CHEAP)})
        api.unpause_once_parsed(WATCHER_DAG_ID, timeout_s=300)
        time.sleep(5)  # unpausing makes the scheduled run of the latest day: not the soak's
        for run in api.runs("&run_type=scheduled"):
            api.call("PATCH", f"/api/v2/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}", {"state": "failed"})
        result["setup_s"] = round(time.monotonic() - began, 1)
        print(f"chaos: the stack is up in {result['setup_s']} s; {cpus} Ray CPUs on 2 nodes", flush=True)

        # both backfills start warm (Spark session, worker group, imports): the first run pays that
        result["warmup"] = backfill(api, warmup_dates, CHEAP, args.timeout_s)
        print(f"chaos: warm-up run {json.dumps(result['warmup'])}", flush=True)
        race_s = args.span_s or RACE_S_PER_DATE * n

        def race(dates: list[str], landing: list[str], tag: str) -> Callable[[], list[str]]:
            """Reruns of ``dates`` and arrivals of ``landing`` while a backfill runs: their run ids."""

            def start() -> list[str]:
                found: list[dict[str, Any]] = []
                thread = threading.Thread(
                    target=lambda: found.extend(manual_reruns(api, seed, dates, args.reruns, race_s, tag)),
                    daemon=True,
                )
                thread.start()
                landed = arrivals(api, stack, seed, landing, race_s, args.rows) if landing else []
                thread.join()
                result.setdefault("raced", {})[tag] = {"reruns": found, "arrivals": landed}
                return [r["run_id"] for r in found + landed]

            return start

        if not args.no_clean:
            result["clean"] = backfill(
                api, clean_dates, CHEAP, args.timeout_s, race(clean_dates, clean_arrivals, "c")
            )
            print(f"chaos: clean backfill {json.dumps(result['clean'])}", flush=True)
        span = args.span_s or result["clean"]["wall_s"]
        faults = draw(seed, args.faults, span, kinds)
        result["schedule"] = [f.as_dict() for f in faults]
        print(f"chaos: seed {seed}, {len(faults)} faults over {span:.0f} s: "
              + ", ".join(f"{f.kind}@{f.at_s:.0f}s" for f in faults), flush=True)  # fmt: skip
        injector = Injector(airflow, stack, jobs_proxy, cos_proxy, fault_log, find_task=task_finder(api))
        thread = injector.run(faults, time.monotonic())
        result["faulted"] = backfill(
            api, fault_dates, CHEAP, args.timeout_s, race(fault_dates, fault_arrivals, "f")
        )
        thread.join(timeout=600)  # faults still running end (a restart, an outage) before the audit
        print(f"chaos: faulted backfill {json.dumps(result['faulted'])}", flush=True)
        if "clean" in result:
            result["ratio"] = round(result["faulted"]["wall_s"] / result["clean"]["wall_s"], 2)
        result["worker_recoveries"] = worker_recoveries(api, fault_log)
        print(f"chaos: killed Celery workers' tasks {json.dumps(result['worker_recoveries'])}", flush=True)
        result["restarts"] = dict(airflow.restarts)

        wait_until_quiet(stack, quiet_s=WARM_IDLE_S + 30 + 30)
        os.environ.update({k: v for k, v in stack.airflow_env().items() if k.startswith("AIRFLOW_CONN_")})
        audit_json = root / "audit.json"
        code = audit.main([
            "--dag", DAG_ID, "--raw-uri", stack.raw_uri, "--staged-uri", f"{stack.staging_uri}/tabular",
            "--dates", ",".join(warmup_dates + clean_dates + fault_dates + clean_arrivals + fault_arrivals),
            "--airflow-url", airflow.url,
            "--airflow-password", airflow.password(), "--logs", str(airflow.home / "logs"),
            "--fault-log", str(fault_log), "--idle-s", "0", "--warm-idle-s", str(WARM_IDLE_S + 30 + 30),
            "--json", str(audit_json),
        ])  # fmt: skip
        result["audit"] = json.loads(audit_json.read_text())
        result["fault_log"] = [
            json.loads(line) for line in fault_log.read_text().splitlines() if line.strip()
        ]
        return code
    finally:
        if injector is not None:
            injector.stopping.set()
        if airflow is not None:
            airflow.stop()
        for proxy in (jobs_proxy, cos_proxy):
            if proxy is not None:
                proxy.stop()
        stack.stop()
        result["total_s"] = round(time.monotonic() - began, 1)
        result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        path = write_json(f"chaos-{seed}.json", result)
        print(
            f"chaos: seed {seed}, ratio {result.get('ratio')}, written {path} in {result['total_s']} s",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
