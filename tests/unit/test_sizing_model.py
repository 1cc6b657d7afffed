"""The backfill sizing model (``emr_ray/sizing/model.py``): the slowest resource sets the period, a few
partitions pay the pipeline's fill and drain, the pools follow the provider's rule, GPUs count only
where there are some, calibration gives back the measured wall, and bad shapes fail with their fix."""

from __future__ import annotations

import dataclasses
import json

import pytest

from devstack.sizing_samples import COSTS, size_record
from emr_ray.sizing.model import (
    Cluster,
    Costs,
    Line,
    Nodes,
    Settings,
    assume_gpu_training,
    calibrate,
    costs_from_sizes,
    predict,
    ray_pool_slots,
)

ROWS = 200_000
SMALL = Cluster((Nodes(1, 12),))


def test_doubling_the_bottleneck_lanes_slots_halves_the_steady_state_time():
    one = predict(COSTS, SMALL, Settings(pool_slots=2), partitions=100, rows=ROWS)
    two = predict(COSTS, SMALL, Settings(pool_slots=4), partitions=100, rows=ROWS)
    assert one.bottleneck == two.bottleneck == "training replicas"
    assert (one.replicas, two.replicas) == (1, 2)
    assert two.period_s == pytest.approx(one.period_s / 2)
    assert two.wall_s - two.latency_s == pytest.approx((one.wall_s - one.latency_s) / 2, abs=0.1)


def test_one_partition_takes_its_latency_and_a_few_pay_the_fill_and_drain():
    alone = predict(COSTS, SMALL, Settings(), partitions=1, rows=ROWS)
    assert alone.wall_s == pytest.approx(COSTS.latency_s(ROWS), abs=0.1)
    few = predict(COSTS, SMALL, Settings(), partitions=3, rows=ROWS)
    assert few.wall_s == pytest.approx(few.latency_s + 2 * few.period_s, abs=0.1)
    many = predict(COSTS, SMALL, Settings(), partitions=365, rows=ROWS)
    assert few.partitions_per_hour < many.partitions_per_hour < many.steady_partitions_per_hour


def test_the_slowest_resource_is_the_bottleneck_and_every_other_is_busy_part_of_the_time():
    big = Cluster((Nodes(4, 16),))
    p = predict(COSTS, big, Settings(), partitions=365, rows=ROWS)
    assert p.bottleneck == "active runs"  # 21 lanes: the DAG's 8 runs at once set the pace
    assert p.period_s == pytest.approx(COSTS.latency_s(ROWS) / 8, abs=0.01)
    assert p.busy["active runs"] == 1 and all(0 <= b <= 1 for b in p.busy.values())
    more_runs = predict(COSTS, big, Settings(max_active_runs=64), partitions=365, rows=ROWS)
    assert more_runs.bottleneck == "promotion pool"  # then the one promotion slot


def test_the_pools_follow_the_providers_rule_and_a_cold_job_is_a_replica_per_slot():
    assert Settings().slots(Cluster((Nodes(1, 16),))) == ray_pool_slots(16) == 10
    assert Settings().replicas(Cluster((Nodes(1, 16),))) == 5
    assert Settings(warm=False).replicas(Cluster((Nodes(1, 16),))) == ray_pool_slots(16, warm=False) == 4
    assert Settings().slots(Cluster((Nodes(1, 2),))) == 1  # smaller than a lane: one slot each


def test_a_cpu_shape_reserves_no_gpu_hours():
    p = predict(COSTS, Cluster((Nodes(4, 16),)), Settings(), partitions=365, rows=ROWS)
    assert p.jobs_gpu_hours == p.cluster_gpu_hours == 0 and p.gpu_utilisation == 0
    assert "cluster GPUs" not in p.periods


def test_a_gpu_shape_limits_the_lanes_to_its_gpus_and_counts_the_trainings_gpu_seconds():
    shape = Cluster((Nodes(2, 32), Nodes(2, 8, gpus=1)))
    costs = assume_gpu_training(COSTS, 1)
    p = predict(costs, shape, Settings(gpus_per_lane=1), partitions=10, rows=ROWS)
    assert (p.pool_slots, p.replicas) == (4, 2)  # 2 GPUs: 2 lanes of the 26 the CPUs allow
    assert p.jobs_gpu_hours == pytest.approx(10 * COSTS.train.job.at(ROWS) / 3600, abs=0.001)
    assert p.cluster_gpu_hours == pytest.approx(2 * p.wall_s / 3600, abs=0.001)


def test_the_machines_cores_are_a_lane_only_where_airflow_shares_it():
    costs = dataclasses.replace(COSTS, host_cpu_s=Line(60.0))
    local = predict(costs, Cluster((Nodes(1, 3),), host_cores=2), Settings(), partitions=10, rows=ROWS)
    assert local.bottleneck == "host cores" and local.period_s == pytest.approx(30.0)
    remote = predict(costs, Cluster((Nodes(1, 3),)), Settings(), partitions=10, rows=ROWS)
    assert "host cores" not in remote.periods and remote.host_cpu_hours is None


def test_utilisation_is_the_jobs_reserved_cpu_over_the_clusters_cpu_time():
    p = predict(COSTS, SMALL, Settings(), partitions=20, rows=ROWS)
    per_partition = COSTS.preprocess.cpu_s.at(ROWS) + COSTS.train.cpu_s.at(ROWS)
    assert p.jobs_cpu_hours == pytest.approx(20 * per_partition / 3600, abs=0.001)
    assert p.cpu_utilisation == pytest.approx(20 * per_partition / (12 * p.wall_s), abs=0.001)


def test_calibration_gives_back_the_measured_wall_and_keeps_the_slope_over_rows():
    costs = dataclasses.replace(COSTS, host_cpu_s=Line(30.0, 5.0))
    local = Cluster((Nodes(1, 3),), host_cores=2)
    calibrated = calibrate(costs, local, Settings(airflow_slots=4), partitions=3, rows=ROWS, wall_s=150.0,
                           host_cpu_s=180.0)  # fmt: skip
    assert calibrated.host_cpu_s == Line(60.0 - 5.0 * 0.2, 5.0)
    again = predict(calibrated, local, Settings(airflow_slots=4), partitions=3, rows=ROWS)
    assert again.wall_s == pytest.approx(150.0, abs=0.2)
    assert calibrated.gaps.fixed > COSTS.gaps.fixed  # a live Airflow's gaps, longer than dags test's


def test_calibration_never_makes_the_gaps_negative():
    fast = calibrate(COSTS, SMALL, Settings(), partitions=3, rows=ROWS, wall_s=1.0)
    assert fast.gaps.fixed == 0


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: Nodes(1, 0), r"cpus=0 per node.*give the CPUs Ray schedules on each node"),
        (lambda: Nodes(0, 16), r"count=0 nodes.*give at least 1"),
        (lambda: Cluster(()), r"no nodes: give at least one"),
        (lambda: Cluster((Nodes(1, 4),), host_cores=0), r"host_cores=0: give the cores"),
        (lambda: Settings(max_active_runs=0), r"max_active_runs=0: give at least 1"),
        (lambda: predict(COSTS, SMALL, Settings(), partitions=0, rows=ROWS), r"partitions=0.*365 for a year"),
        (lambda: predict(assume_gpu_training(COSTS, 1), SMALL, Settings(), partitions=1, rows=ROWS),
         r"GPU-seconds.*has no GPUs: give the GPU nodes"),
    ],
)  # fmt: skip
def test_bad_input_fails_naming_the_input_and_the_fix(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_costs_are_fitted_over_the_measured_sizes_and_never_fall_with_rows():
    sizes = [
        size_record(20_000, 10.0, 3.0, host_cpu_s=40.0),
        size_record(1_020_000, 30.0, 2.5, host_cpu_s=50.0),
    ]
    costs = costs_from_sizes(sizes)
    assert costs.train.job == Line(
        pytest.approx(8.6), pytest.approx(20.0)
    )  # the job's wall: 9 s + 20 s per 1M
    assert costs.train.task.at(1_020_000) == pytest.approx(30.0)  # the job and Airflow's side of it
    assert costs.train.cpu_s.per_1m == pytest.approx(40.0)
    assert costs.airflow_tasks["wait_for_partition"] == Line(2.75, 0.0)  # fell: flat, at the mean
    assert costs.gaps.fixed == pytest.approx(1.5) and costs.host_cpu_s.per_1m == pytest.approx(10.0)
    # a partition end to end: the tasks' span, less the sensor's 0.25 s above its flat mean
    assert costs.latency_s(20_000) == pytest.approx(sizes[0]["tasks_span_s"] - 0.25)


def test_costs_need_two_sizes_and_say_how_to_measure_them():
    with pytest.raises(ValueError, match=r"two sizes or more.*--sizes 20000,200000"):
        costs_from_sizes([size_record(20_000, 10.0, 3.0)])


def test_costs_survive_their_json():
    costs = costs_from_sizes(
        [size_record(20_000, 10.0, 3.0, 40.0), size_record(200_000, 12.0, 3.0, 44.0)], "here"
    )
    assert Costs.from_dict(json.loads(json.dumps(costs.to_dict()))) == costs
