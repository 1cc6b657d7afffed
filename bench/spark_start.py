"""What starting a Spark session on Ray costs, with the driver's and app master's JVMs on the full JIT
(C1 and C2) against C1 only, side by side in one run.

- ``full_jit``: every JVM of the session with :data:`~emr_ray.cluster.jobs.spark_steps.JAVA_OPTIONS`;
- ``c1_control``: the provider's default (:func:`~emr_ray.cluster.jobs.spark_steps.spark_configs`):
  the driver and RayDP's app master compile with C1 only, the executors keep the full JIT.

Each session starts in a driver process of its own (RayDP cannot start a second session in one
driver) on one local Ray head of 3 CPUs, contenders alternating, one executor of one core: the
seconds of ``raydp.init_spark``, of the first Spark job (a group-by: the executor's JVM warms up),
and of a second one. Writes ``bench/results/spark-start.json``.

    bash scripts/loopback.sh .venv/bin/python -m bench.spark_start --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench._common import REPO, STATE, machine, table, write_json

CONTENDERS = ("full_jit", "c1_control")


def session_configs(contender: str) -> dict[str, str]:
    from emr_ray.cluster.jobs.spark_steps import JAVA_OPTIONS, spark_configs

    if contender == "c1_control":
        return spark_configs()
    return spark_configs(
        {f"spark.{role}.extraJavaOptions": JAVA_OPTIONS for role in ("driver", "ray.raydp_app_master")}
    )


def one_session(contender: str, address: str) -> dict[str, float]:
    """In this (child) process: start a session, run two jobs, stop it; their seconds."""
    import ray
    import raydp

    ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    seconds: dict[str, float] = {}
    began = time.perf_counter()
    spark = raydp.init_spark(app_name=f"bench-{contender}", num_executors=1, executor_cores=1,
                             executor_memory="1g", configs=session_configs(contender))  # fmt: skip
    seconds["init_spark"] = time.perf_counter() - began
    for job in ("first_job", "second_job"):
        began = time.perf_counter()
        spark.range(100_000).selectExpr("id % 7 as k").groupBy("k").count().collect()
        seconds[job] = time.perf_counter() - began
    raydp.stop_spark()
    seconds["start_to_first_result"] = seconds["init_spark"] + seconds["first_job"]
    return {k: round(v, 2) for k, v in seconds.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from devstack.ray_head import cluster_env, start_head, stop_head

    state = STATE / "spark-start"
    os.environ.update(cluster_env(state))
    if args.child:
        print(json.dumps(one_session(args.child, args.address)), flush=True)
        return
    result: dict[str, Any] = {
        "machine": machine(),
        "rounds": args.rounds,
        "runs": {c: [] for c in CONTENDERS},
    }
    head = start_head(state, num_cpus=3, dashboard_port=8266, gcs_port=6381)
    try:
        for _ in range(args.rounds):
            for contender in CONTENDERS:
                out = subprocess.run([sys.executable, "-m", "bench.spark_start", "--child", contender,
                                      "--address", head.gcs_address], cwd=REPO, check=True,
                                     capture_output=True, text=True).stdout  # fmt: skip
                result["runs"][contender].append(json.loads(out.strip().splitlines()[-1]))
                print(contender, result["runs"][contender][-1], flush=True)
    finally:
        stop_head(state)
    result["loadavg_at_end"] = [round(v, 2) for v in os.getloadavg()]
    rows, medians = [], {}
    for figure in ("init_spark", "first_job", "second_job", "start_to_first_result"):
        per = {c: statistics.median(r[figure] for r in result["runs"][c]) for c in CONTENDERS}
        medians[figure] = per
        rows.append(
            [figure, *(f"{per[c]:.1f}" for c in CONTENDERS), f"{per['full_jit'] / per['c1_control']:.2f}x"]
        )
    result["medians_s"] = medians
    print(table(["median seconds", *CONTENDERS, "ratio"], rows))
    print(
        f"load average {result['machine']['loadavg_at_start'][0]} at the start, {result['loadavg_at_end'][0]} at the end"
    )
    print("wrote", write_json("spark-start.json", result))


if __name__ == "__main__":
    main()
