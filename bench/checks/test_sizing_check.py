"""The sizing benchmark's own pieces (``bench/sizing.py``), no server started: the machine's CPU meter,
and a check's calibration and record from measured backfills. Here, beside the benchmark: the
provider's tests never import ``bench/``."""

from __future__ import annotations

import dataclasses
import time

import pytest

from bench.pipeline import CONTENDERS
from bench.sizing import HostCpu, calibrated, check_table, compared, local_cluster, local_settings
from devstack.sizing_samples import COSTS
from emr_ray.sizing.model import Line, predict


def test_the_cpu_meter_counts_this_process_busy_seconds():
    with HostCpu(interval=0.05) as meter:
        deadline = time.process_time() + 0.4
        while time.process_time() < deadline:
            pass
    host = meter.result()
    assert 0.3 <= host["cpu_s"] and host["others_busy_cores"] >= 0 and host["machine_cores"] >= 1


def backfill_record(days: int, rows: int, wall_s: float, cpu_s: float, others: float) -> dict:
    """What ``run_backfill`` returns, as much of it as the checks read."""
    host = {"cpu_s": cpu_s, "wall_s": wall_s, "others_busy_cores": others, "machine_cores": 2}
    return {"days": days, "rows": rows, "wall_s": wall_s, "utilisation": 0.4, "host": host}


def test_a_calibrated_backfill_is_predicted_back_and_a_check_records_its_error_and_hindsight():
    conf = CONTENDERS["warm_defer_at_once"]
    costs = dataclasses.replace(COSTS, host_cpu_s=Line(30.0, 5.0))
    calibrated_costs = calibrated(costs, backfill_record(3, 200_000, 150.0, 180.0, others=0.5), 3, conf)
    one = local_cluster(3, None, host_cores=1.5)
    again = predict(calibrated_costs, one, local_settings(one, conf), partitions=3, rows=200_000)
    assert again.wall_s == pytest.approx(150.0, abs=0.2) and again.pool_slots == 2

    two = local_cluster(3, 3, host_cores=1.5)
    before = predict(calibrated_costs, two, local_settings(two, conf), partitions=10, rows=200_000)
    assert before.pool_slots == 4 and before.bottleneck == "host cores"
    record = compared(
        calibrated_costs, two, conf, 2, before, backfill_record(10, 200_000, 400.0, 600.0, others=0.0)
    )
    assert record["error_pct"] == pytest.approx(100 * (before.wall_s - 400.0) / 400.0, abs=0.1)
    assert record["hindsight"]["wall_s"] < before.wall_s  # the others left 2 free cores during it, not 1.5
    assert "| 2 node(s), 6 Ray CPUs, pools 4" in check_table([record])
