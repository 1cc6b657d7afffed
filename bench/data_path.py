"""Benchmark: rows/s from staged Parquet into torch tensors, for the Spark handoff and the Ray paths.

Same synthetic data for every path (``--rows`` x 16 float32 features + int64 label, in 8 Parquet
files under ``.state/bench/data``). Paths:

* ``a_off`` / ``a_on``: the seed article's path on Spark on Ray (RayDP, 1 executor x 1 core, 2g):
  ``spark.read.parquet`` -> ``toPandas()`` -> ``torch.tensor`` -> ``TensorDataset``, with Arrow off
  (Spark's default) and with ``spark.sql.execution.arrow.pyspark.enabled=true``; one Spark session each.
* ``b``: the feed the operators use (``emr_ray.cluster.jobs.train`` + ``include.training.loop``): the driver
  reads each file's row count from its Parquet footer (``shards.describe``, no data read); 2 actors
  (1 CPU each, as the 2 train workers) each plan their contiguous rows with ``shards.plan(...,
  equal=True)``, read them with ``shards.read`` (pyarrow ``LocalFileSystem``, only the row groups
  they overlap), convert them with ``include.training.loop._tensors`` itself (see
  ``bench._common.worker_tensors``), then take one pass of ``--batch-size`` minibatches. Timed:
  footers + read + convert + one pass. Actor start-up (train-worker start-up) is reported apart.
  Cold: the first read of fresh actors, ``--cold-rounds`` times with new actors (median); warm: the
  last round's actors again. Each (b) read is paired with a (c) read in this process, in the same
  page cache state (the files dropped before each cold read of either) and under the same load
  (cold pairs alternate which goes first): the "same load" verdicts compare these pairs. The
  actors import this tree's ``plugins/`` and ``include/`` (checked: ``PYTHONPATH`` from
  ``bench._common.setup_env``), not an installed copy.
* ``b_raydata``: the feed before this change: ``ray.data.read_parquet(files).materialize()`` on the
  driver, then 2 actors iterate their ``streaming_split(2, equal=True)`` shard with
  ``iter_torch_batches(--batch-size)`` and stack the feature columns. Timed: materialize + one pass;
  actor start-up is reported apart. ``reiterate`` is a second pass over the same materialized data
  (an epoch after the first).
* ``c``: ``pyarrow.parquet.read_table`` -> ``torch.from_numpy`` in this one process (upper bound). Its
  imports (``pyarrow.dataset``, and pandas, which pyarrow's ``to_numpy`` imports on first use) are
  paid before its first read, as (b)'s actors pay theirs at start-up.

Cold: the first read of a session (fresh Spark session / fresh actors), after dropping the files
from the OS page cache. Warm: the following reads (``--repeat`` of them). Start-up (``ray.init``,
``raydp.init_spark``, actor start) is reported apart, not in the rows/s. Figures are wall-clock on
a shared, loaded 2-core machine: each carries the 1-minute load average at the time.

``--subset PATH=FILES`` runs a slow path on the first FILES of the 8 files only (for 10M rows, where
the Arrow-off Spark path alone would take over 10 minutes and hold ~10 GB); such a path reports the
rows it read, and the targets compare rows/s, not seconds.

Run inside the loopback-only namespace::

    bash scripts/loopback.sh .venv/bin/python -m bench.data_path --rows 1000000 --repeat 2
    bash scripts/loopback.sh .venv/bin/python -m bench.data_path --rows 10000000 --repeat 1 \\
        --subset a_off=2 --subset b_raydata=2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench._common import (
    FEATURE_COLUMNS,
    FILES_PER_DATASET,
    LABEL_COLUMN,
    REPO,
    STATE,
    evict,
    footer_rows,
    init_ray,
    machine,
    read_shard,
    setup_env,
    shard_config,
    timed,
    write_dataset,
    write_json,
)
from bench.data_path_report import PATHS, TARGETED, report, verdict


class BatchConsumer:
    """Stands in for a train worker fed by Ray Data (the feed before the per-worker shards)."""

    def __init__(self) -> None:
        import ray.data  # noqa: F401  (imports paid here, as in a started train worker)
        import torch  # noqa: F401

    def ready(self) -> int:
        return os.getpid()

    def consume(self, shard, batch_size: int) -> dict[str, Any]:
        import torch

        started = time.perf_counter()
        rows = batches = 0
        for batch in shard.iter_torch_batches(batch_size=batch_size, drop_last=False):
            x = torch.stack([batch[c].to(torch.float32) for c in FEATURE_COLUMNS], dim=1)
            y = batch[LABEL_COLUMN].to(torch.long)
            rows += len(y)
            batches += 1
            assert x.shape == (len(y), len(FEATURE_COLUMNS))
        return {"rows": rows, "batches": batches, "seconds": time.perf_counter() - started}


class ShardWorker:
    """Stands in for train worker ``rank`` of ``world``: reads its own rows as the train loop does."""

    def __init__(self, rank: int, world: int) -> None:
        import pyarrow.parquet  # noqa: F401  (imports paid here, as in a started train worker)
        import torch  # noqa: F401

        import bench._common  # noqa: F401
        import emr_ray.cluster.jobs.shards  # noqa: F401
        import include.training.loop  # noqa: F401

        self.rank, self.world = rank, world

    def ready(self) -> int:
        return os.getpid()

    def code(self) -> str:
        """Where this actor's feed code comes from (the tree under test, not another checkout)."""
        import emr_ray.cluster.jobs.shards

        return emr_ray.cluster.jobs.shards.__file__

    def read(self, config: dict[str, Any], batch_size: int) -> dict[str, Any]:
        from bench._common import worker_tensors

        started = time.perf_counter()
        x, y = worker_tensors(config, "train", self.rank, self.world)  # plan + read + loop._tensors
        read_seconds = time.perf_counter() - started
        batches = 0
        for i in range(0, len(y), batch_size):  # one pass of minibatches, as loop._batches slices them
            xb, yb = x[i : i + batch_size], y[i : i + batch_size]
            batches += 1
            assert xb.shape == (len(yb), len(FEATURE_COLUMNS))
        return {
            "rows": len(y),
            "batches": batches,
            "read_seconds": read_seconds,
            "seconds": time.perf_counter() - started,
        }


def _summary(runs: list[dict[str, Any]], rows: int, cold_rounds: int = 1) -> dict[str, Any]:
    """Figures of ``runs``: the first ``cold_rounds`` are cold reads (their median is the cold figure)."""
    cold, warm = runs[:cold_rounds], runs[cold_rounds:]
    cold_s = statistics.median(r["seconds"] for r in cold)
    warm_s = [r["seconds"] for r in warm]
    return {
        "rows": rows,
        "cold_s": cold_s,
        "cold_rounds_s": [r["seconds"] for r in cold],
        "cold_load1": ", ".join(str(r["seconds_load1"]) for r in cold),
        "warm_s": warm_s,
        "warm_load1": [r["seconds_load1"] for r in warm],
        "warm_median_s": statistics.median(warm_s) if warm_s else None,
        "cold_rows_per_s": rows / cold_s,
        "warm_rows_per_s": rows / statistics.median(warm_s) if warm_s else None,
        "runs": runs,
    }


def c_read(files: list[str], rows: int, *, cold: bool) -> dict[str, Any]:
    """One (c) read of ``files`` in this process; ``cold``: the files are dropped from the page cache first."""
    if cold:
        evict(files)
    run: dict[str, Any] = {}
    with timed(run, "seconds"):
        x, y = read_shard(files)
    assert len(y) == rows and x.shape == (rows, len(FEATURE_COLUMNS))
    return run


def bench_c(files: list[str], rows: int, repeat: int) -> dict[str, Any]:
    # imports are not part of the read: read_table's own (pyarrow.dataset) and the pandas that
    # pyarrow's to_numpy imports on its first call, 0.3 s of a first read here
    import pandas  # noqa: F401
    import pyarrow.dataset  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    import torch  # noqa: F401

    return _summary([c_read(files, rows, cold=i == 0) for i in range(repeat + 1)], rows)


def bench_b(
    files: list[str], rows: int, repeat: int, batch_size: int, workers: int, *, cold_rounds: int = 1
) -> dict[str, Any]:
    """The per-worker shard feed. Cold: the first read of freshly started actors, ``cold_rounds``
    times (new actors each round; the median is the figure); warm: the last round's actors again.

    Every (b) read is paired with a (c) read in this process, under the same machine load and the
    same page cache state: for a cold pair the files are dropped from the page cache before each
    of the two reads, and the pair's order alternates (c first in even rounds), so neither read
    finds pages the other brought in nor always comes first after actor start-up; a warm (c) read
    comes just before each warm (b) read. The within-(c) checks compare these pairs.
    """
    import ray

    worker = ray.remote(num_cpus=1)(ShardWorker)
    result: dict[str, Any] = {"actor_start_s": [], "paired_c_cold_s": [], "paired_c_warm_s": []}
    runs: list[dict[str, Any]] = []
    actors: list[Any] = []

    def b_read(cold: bool) -> dict[str, Any]:
        if cold:
            evict(files)
        run: dict[str, Any] = {}
        with timed(run, "seconds"):
            with timed(run, "footers_s"):  # the job's planning step: row counts from the footers
                config = shard_config(footer_rows(files), equal=True)
            out = ray.get([a.read.remote(config, batch_size) for a in actors])
        run["rows_per_worker"] = [o["rows"] for o in out]
        run["batches_per_worker"] = [o["batches"] for o in out]
        run["worker_read_s"] = [round(o["read_seconds"], 3) for o in out]
        # equal=True: every worker gets rows // workers rows, at most workers - 1 are dropped
        assert len(set(run["rows_per_worker"])) == 1 and rows - workers < sum(run["rows_per_worker"]) <= rows
        return run

    try:
        for i in range(cold_rounds):
            for a in actors:
                ray.kill(a)
            start: dict[str, Any] = {}
            with timed(start, "s"):  # not counted: this is train-worker start-up
                actors = [worker.remote(rank, workers) for rank in range(workers)]
                ray.get([a.ready.remote() for a in actors])
            result["actor_start_s"].append(start["s"])
            code = sorted(set(ray.get([a.code.remote() for a in actors])))
            if any(not path.startswith(str(REPO)) for path in code):
                raise RuntimeError(f"The actors import {code}, not this tree's code ({REPO}).")
            result["actor_code"] = code
            if i % 2 == 0:
                result["paired_c_cold_s"].append(c_read(files, rows, cold=True)["seconds"])
            runs.append(b_read(cold=True))
            if i % 2 == 1:
                result["paired_c_cold_s"].append(c_read(files, rows, cold=True)["seconds"])
        for _ in range(repeat):
            result["paired_c_warm_s"].append(c_read(files, rows, cold=False)["seconds"])
            runs.append(b_read(cold=False))
    finally:
        for a in actors:
            ray.kill(a)
    result |= _summary(runs, rows, cold_rounds)
    result["actor_start_median_s"] = statistics.median(result["actor_start_s"])
    result["paired_c_cold_median_s"] = statistics.median(result["paired_c_cold_s"])
    result["paired_c_warm_median_s"] = (
        statistics.median(result["paired_c_warm_s"]) if result["paired_c_warm_s"] else None
    )
    result["paired_c_rows"] = rows
    return result


def bench_b_raydata(
    files: list[str],
    rows: int,
    repeat: int,
    batch_size: int,
    workers: int,
    *,
    reiterate: bool,
    all_files: list[str],
) -> dict[str, Any]:
    """The Ray Data feed before this change; ``files`` may be a subset of ``all_files`` (``--subset``)."""
    import ray
    import ray.data

    consumer = ray.remote(num_cpus=1)(BatchConsumer)
    runs = []
    for i in range(repeat + 1):
        if i == 0:
            evict(files)
        run: dict[str, Any] = {}
        if i > 0:  # a (c) read of all the files just before, under the same machine load
            with timed(run, "paired_c_s"):
                x, y = read_shard(all_files)
            del x, y
        with timed(run, "materialize_s"):
            ds = ray.data.read_parquet(files, partitioning=None).materialize()
        with timed(run, "actor_start_s"):  # not counted: this is train-worker start-up
            actors = [consumer.remote() for _ in range(workers)]
            ray.get([a.ready.remote() for a in actors])
        with timed(run, "iterate_s"):
            splits = ds.streaming_split(workers, equal=True)
            out = ray.get([a.consume.remote(s, batch_size) for a, s in zip(actors, splits, strict=True)])
        assert sum(o["rows"] for o in out) == rows, out
        if reiterate:
            with timed(run, "reiterate_s"):  # epoch 2: the same materialized data again
                splits = ds.streaming_split(workers, equal=True)
                again = ray.get(
                    [a.consume.remote(s, batch_size) for a, s in zip(actors, splits, strict=True)]
                )
            assert sum(o["rows"] for o in again) == rows, again
        run["seconds"] = round(run["materialize_s"] + run["iterate_s"], 3)
        run["seconds_load1"] = run["iterate_s_load1"]
        run["rows_per_worker"] = [o["rows"] for o in out]
        run["batches_per_worker"] = [o["batches"] for o in out]
        for a in actors:
            ray.kill(a)
        del ds
        runs.append(run)
    result = _summary(runs, rows)
    warm = runs[1:] or runs
    if reiterate:
        result["reiterate_median_s"] = statistics.median(r["reiterate_s"] for r in warm)
    result["materialize_median_s"] = statistics.median(r["materialize_s"] for r in warm)
    result["iterate_median_s"] = statistics.median(r["iterate_s"] for r in warm)
    result["actor_start_median_s"] = statistics.median(r["actor_start_s"] for r in runs)
    paired = [r["paired_c_s"] for r in runs if "paired_c_s" in r]
    result["paired_c_warm_median_s"] = statistics.median(paired) if paired else None
    result["paired_c_rows"] = sum(n for _, n in footer_rows(all_files))
    return result


def bench_a(files: list[str], rows: int, repeat: int, *, arrow: bool) -> dict[str, Any]:
    import raydp
    import torch
    from torch.utils.data import TensorDataset

    from emr_ray.cluster.jobs.spark import spark_configs

    extra = {
        "spark.sql.execution.arrow.pyspark.enabled": "true" if arrow else "false",
        "spark.driver.memory": "4g",
        "spark.driver.maxResultSize": "4g",
        "spark.ui.showConsoleProgress": "false",
    }
    result: dict[str, Any] = {}
    with timed(result, "init_spark_s"):
        spark = raydp.init_spark(
            app_name=f"bench-arrow-{'on' if arrow else 'off'}",
            num_executors=1,
            executor_cores=1,
            executor_memory="2g",
            configs=spark_configs(extra),
        )
    runs = []
    try:
        uris = [f"file://{f}" for f in files]
        for i in range(repeat + 1):
            if i == 0:
                evict(files)
            run: dict[str, Any] = {}
            with timed(run, "seconds"):
                pdf = spark.read.parquet(*uris).toPandas()
                x = torch.tensor(pdf[FEATURE_COLUMNS].values, dtype=torch.float32)
                y = torch.tensor(pdf[LABEL_COLUMN].values, dtype=torch.long)
                dataset = TensorDataset(x, y)
            assert len(dataset) == rows
            runs.append(run)
            del pdf, x, y, dataset
    finally:
        with timed(result, "stop_spark_s"):
            raydp.stop_spark()
    return result | _summary(runs, rows)


def spark_in_child(key: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run ``bench_a`` in a child process attached to this Ray cluster, one Spark session per child.

    A second ``raydp.init_spark`` after ``stop_spark`` in the same process loses its app master
    (the actor dies at start) with RayDP 1.6.5 here; a fresh driver process per session does not.
    """
    import ray

    out = STATE / f"spark-{key}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.data_path", "--rows", str(args.rows), "--repeat", str(args.repeat)]
    for name, count in args.subset.items():
        cmd += ["--subset", f"{name}={count}"]
    cmd += ["--spark-child", key, "--ray-address", ray.get_runtime_context().gcs_address]
    subprocess.run(cmd, check=True, cwd=REPO, env=os.environ | {"BENCH_CHILD_OUT": str(out)})
    return json.loads(out.read_text())


def spark_child(key: str, args: argparse.Namespace) -> None:
    import logging

    import ray

    files, rows = _files_for(key, write_dataset(args.rows, f"rows-{args.rows}"), args)
    ray.init(address=args.ray_address, logging_level=logging.WARNING, log_to_driver=False)
    try:
        result = bench_a(files, rows, args.repeat, arrow=key == "a_on")
    finally:
        ray.shutdown()
    Path(os.environ["BENCH_CHILD_OUT"]).write_text(json.dumps(result))


def _files_for(key: str, files: list[str], args: argparse.Namespace) -> tuple[list[str], int]:
    """The files path ``key`` reads (the first ``--subset`` of them, or all) and their rows."""
    chosen = files[: args.subset[key]] if key in args.subset else files
    rows = args.rows if len(chosen) == len(files) else sum(n for _, n in footer_rows(chosen))
    return chosen, rows


def _subset(value: str) -> tuple[str, int]:
    name, _, count = value.partition("=")
    if name not in PATHS or not count.isdigit() or not 1 <= int(count) <= FILES_PER_DATASET:
        raise argparse.ArgumentTypeError(f"{value!r}: want PATH=FILES, PATH in {PATHS}, 1 <= FILES <= 8")
    return name, int(count)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2, help="warm reads per path (after the cold one)")
    parser.add_argument("--batch-size", type=int, default=256, help="the tabular DAG's default")
    parser.add_argument("--workers", type=int, default=2, help="train workers (actors) of b and b_raydata")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"subset of {','.join(PATHS)}")
    parser.add_argument(
        "--cold-rounds",
        type=int,
        default=3,
        help="b: cold reads, each by fresh actors and paired with a cold (c) read (median reported)",
    )
    parser.add_argument(
        "--subset",
        type=_subset,
        action="append",
        default=[],
        metavar="PATH=FILES",
        help=f"read only the first FILES of the {FILES_PER_DATASET} files on PATH (repeatable), e.g. a_off=2",
    )
    parser.add_argument(
        "--reiterate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="b_raydata: also time a second pass over the materialized data (epoch >= 2)",
    )
    parser.add_argument("--spark-child", choices=["a_on", "a_off"], help=argparse.SUPPRESS)
    parser.add_argument("--ray-address", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.subset = dict(args.subset)
    if args.spark_child:
        setup_env()
        spark_child(args.spark_child, args)
        return
    chosen = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = set(chosen) - set(PATHS)
    if unknown:
        parser.error(f"unknown path(s) {sorted(unknown)}; choose from {PATHS}")

    setup_env()  # before anything imports ray: Ray reads RAY_AUTH_MODE at import
    started = time.perf_counter()
    files = write_dataset(args.rows, f"rows-{args.rows}")
    print(f"data ready in {time.perf_counter() - started:.1f} s: {os.path.dirname(files[0])}", flush=True)
    result: dict[str, Any] = {
        "rows": args.rows,
        "files": FILES_PER_DATASET,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "repeat": args.repeat,
        "subset": args.subset,
        "paths": {},
    }
    paths = result["paths"]
    if "c" in chosen:
        paths["c"] = bench_c(*_files_for("c", files, args), args.repeat)
        print(f"c done: cold {paths['c']['cold_s']} s", flush=True)
    import ray

    result["ray_init_s"] = round(init_ray(num_cpus=2), 2)
    result["machine"] = machine()
    try:
        if "b" in chosen:
            paths["b"] = bench_b(
                *_files_for("b", files, args),
                args.repeat,
                args.batch_size,
                args.workers,
                cold_rounds=args.cold_rounds,
            )
            print(f"b done: cold {paths['b']['cold_s']} s", flush=True)
        if "b_raydata" in chosen:
            paths["b_raydata"] = bench_b_raydata(
                *_files_for("b_raydata", files, args),
                args.repeat,
                args.batch_size,
                args.workers,
                reiterate=args.reiterate,
                all_files=files,
            )
            print(f"b_raydata done: cold {paths['b_raydata']['cold_s']} s", flush=True)
        for key in ("a_on", "a_off"):
            if key in chosen:
                paths[key] = spark_in_child(key, args)
                print(f"{key} done: cold {paths[key]['cold_s']} s", flush=True)
    finally:
        ray.shutdown()
    result["targets"] = {
        which: {"cold": verdict(paths, which, "cold"), "warm": verdict(paths, which, "warm")}
        for which in TARGETED
    }
    result["loadavg_at_end"] = [round(v, 2) for v in os.getloadavg()]
    result["total_s"] = round(time.perf_counter() - started, 1)
    text = report(result)
    result["table"] = text
    path = write_json(f"data_path-{args.rows}.json", result)
    print(text)
    print(f"\nwritten {path} in {result['total_s']} s total")


if __name__ == "__main__":
    main()
