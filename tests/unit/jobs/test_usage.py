"""A job's resource accounting (``emr_ray.cluster.jobs._usage``) without a cluster: the phase recorder, the
reservation maths, the log line and the MLflow metrics. On a real cluster: ``tests/integration/test_job_usage.py``.
"""

from __future__ import annotations

import json

import pytest

from emr_ray.cluster.jobs import _usage
from emr_ray.cluster.jobs._runtime import main
from emr_ray.cluster.jobs._usage import Held, Recorder
from emr_ray.cluster.results import PoolIdle, Usage


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_phase_times_a_block_and_adds_up_repeated_names():
    clock = Clock()
    recorder = Recorder(clock)
    for seconds in (2.0, 3.0):
        with recorder.phase("write"):
            clock.now += seconds
    assert recorder.phases == {"write": 5.0}


def test_a_phase_that_raises_is_still_recorded():
    clock = Clock()
    recorder = Recorder(clock)
    with pytest.raises(RuntimeError), recorder.phase("commit"):
        clock.now += 1.5
        raise RuntimeError("boom")
    assert recorder.phases == {"commit": 1.5}


def test_lap_times_the_stretch_since_the_previous_phase_or_lap():
    clock = Clock()
    recorder = Recorder(clock)
    clock.now += 1.0
    recorder.lap("check_input")  # since the recorder started
    with recorder.phase("spark_start"):
        clock.now += 20.0
    clock.now += 4.0
    recorder.lap("read")  # since spark_start ended, not since check_input
    assert recorder.phases == {"check_input": 1.0, "spark_start": 20.0, "read": 4.0}


def test_lap_splits_out_the_sub_steps_the_job_timed_itself():
    clock = Clock()
    recorder = Recorder(clock)
    clock.now += 30.0
    recorder.lap("log", fit=26.5)
    assert recorder.phases == {"fit": 26.5, "log": 3.5}


def test_placement_group_resources_count_once_under_their_plain_name():
    pg = "d46d5f26392bec732d5051c92eb702000000"
    required = {f"CPU_group_{pg}": 1.0, f"CPU_group_0_{pg}": 1.0, f"bundle_group_{pg}": 0.001,
                f"bundle_group_0_{pg}": 0.001, "memory": 2**30}  # fmt: skip
    assert _usage.base_resources(required) == {"CPU": 1.0, "memory": 2**30}
    assert _usage.base_resources({"CPU": 2.0, "GPU": 1.0}) == {"CPU": 2.0, "GPU": 1.0}


def test_reserved_seconds_are_resources_times_lifetime_and_the_open_ones_end_now():
    held = [
        Held("actor", "RayDPExecutor", {"CPU": 1.0, "memory": 2**30}, start=10.0, end=40.0),
        Held("actor", "RayTrainWorker", {"CPU": 1.0, "GPU": 1.0}, start=50.0, end=None),  # still alive
        Held("task", "where", {"CPU": 0.5}, start=0.0, end=4.0),
    ]
    now = 60.0
    assert _usage.resource_seconds(held, "CPU", now) == 30.0 + 10.0 + 2.0
    assert _usage.resource_seconds(held, "GPU", now) == 10.0
    assert _usage.by_name(held, now) == {
        "actor:RayDPExecutor": {"count": 1, "seconds": 30.0, "cpu_seconds": 30.0},
        "actor:RayTrainWorker": {"count": 1, "seconds": 10.0, "cpu_seconds": 10.0, "gpu_seconds": 10.0},
        "task:where": {"count": 1, "seconds": 4.0, "cpu_seconds": 2.0},
    }


def test_peak_is_the_most_held_at_one_time():
    gib = float(2**30)
    held = [
        Held("actor", "a", {"memory": gib}, start=0.0, end=10.0),
        Held("actor", "b", {"memory": 2 * gib}, start=5.0, end=20.0),  # overlaps a: 3 GiB
        Held("actor", "c", {"memory": 2 * gib}, start=20.0, end=30.0),  # starts as b ends: not 4
    ]
    assert _usage.peak(held, "memory", now=30.0) == 3 * gib
    assert _usage.peak(held, "GPU", now=30.0) == 0.0


def test_summary_is_one_line_with_the_figures_and_what_is_missing():
    usage = Usage(
        wall_seconds=34.24,
        cpu_seconds_reserved=61.0,
        gpu_seconds_reserved=0.0,
        actors=3,
        tasks=0,
        memory={"driver_peak_rss_mb": 512.3, "reserved_peak_mb": 1024.0},
        phases={"spark_start": 21.3, "commit": 0.4},
        missing=["tasks (DataSourceUnavailable: GCS down)"],
    )
    line = _usage.summary(usage)
    assert "\n" not in line
    assert line.startswith("1 job, 34.2 s wall, 61.0 CPU-s and 0.0 GPU-s reserved (3 actor(s), 0 task(s))")
    assert "driver peak RSS 512 MB" in line and "peak memory reserved 1024 MB" in line
    assert "phases: spark_start 21.3 s, commit 0.4 s" in line
    assert line.endswith("not measured: tasks (DataSourceUnavailable: GCS down)")
    assert _usage.summary(Usage(error="KeyError: 'x'")) == "usage not measured (KeyError: 'x')"
    assert _usage.summary(None) == "usage not measured (the job reported none)"


def test_mlflow_metrics_flatten_the_figures_and_phases():
    usage = Usage(
        wall_seconds=50.0,
        cpu_seconds_reserved=80.5,
        gpu_seconds_reserved=0.0,
        memory={"driver_peak_rss_mb": 400.0, "children_peak_rss_mb": None},
        phases={"fit": 30.0, "log": 4.0},
    )
    assert _usage.mlflow_metrics(usage) == {
        "usage.wall_seconds": 50.0,
        "usage.cpu_seconds_reserved": 80.5,
        "usage.gpu_seconds_reserved": 0.0,
        "usage.driver_peak_rss_mb": 400.0,
        "usage.phase.fit_seconds": 30.0,
        "usage.phase.log_seconds": 4.0,
    }
    assert _usage.mlflow_metrics(Usage(error="no figures")) == {}


def test_report_without_a_ray_connection_has_wall_time_phases_and_the_drivers_memory():
    recorder = _usage.start()
    _usage.lap("work")
    usage = _usage.report(recorder).to_dict()  # as the result's JSON carries it
    assert usage["cpu_seconds_reserved"] == 0.0 and usage["actors"] == 0 and usage["tasks"] == 0
    assert usage["missing"] == [] and "error" not in usage and "pool_idle" not in usage
    assert set(usage["phases"]) == {"startup", "work"}  # startup: this process's start to start()
    assert usage["wall_seconds"] >= usage["phases"]["startup"] > 0
    assert usage["ended_at"] > usage["started_at"] and 0 <= usage["measuring_seconds"] < 1
    assert usage["memory"]["driver_peak_rss_mb"] > 10  # this pytest process


def test_a_warm_pools_idle_time_before_a_call_is_counted_apart_from_what_the_job_held():
    """A pool's CPUs held idle between two jobs are counted by the job that ends the idle stretch:
    in its own figure (``pool_idle``), in the one-line summary and in the MLflow metrics."""
    recorder = _usage.start()
    _usage.borrow("actor", "SharedTrainWorkers", {"CPU": 2.0, "GPU": 1.0}, 1000.0, 1010.0, idle_before=30.0)
    usage = _usage.report(recorder)
    assert usage.pool_idle == PoolIdle(seconds=30.0, cpu_seconds=60.0, gpu_seconds=30.0)
    assert usage.cpu_seconds_reserved == 20.0  # the call itself, as before
    assert "warm pools idle before its calls 30 s (60.0 CPU-s, 30.0 GPU-s)" in _usage.summary(usage)
    assert _usage.mlflow_metrics(usage)["usage.pool_idle_cpu_seconds"] == 60.0
    _usage.start()
    assert _usage.report().pool_idle is None


def test_report_never_raises_and_says_what_failed():
    class BrokenClock(Clock):
        calls = 0

        def __call__(self) -> float:
            self.calls += 1
            if self.calls > 1:
                raise OSError("clock gone")
            return self.now

    usage = _usage.report(Recorder(BrokenClock()))
    assert usage.to_dict() == {"error": "OSError: clock gone", "phases": {}}


def test_every_job_result_carries_usage(capsys, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"payload": "x"}))

    def run(payload):
        with _usage.phase("echo"):
            return {"echo": payload["payload"]}

    main(run, ["--spec", str(spec)])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1].split(" ", 1)[1])
    assert result["echo"] == "x"
    assert set(result["usage"]["phases"]) >= {"echo"} and result["usage"]["wall_seconds"] > 0


def test_what_a_job_borrowed_from_a_shared_session_counts_as_its_own_reservation():
    recorder = _usage.start()
    _usage.borrow("actor", "SharedSparkExecutors", {"CPU": 2.0}, 1000.0, 1003.5)
    usage = _usage.report(recorder)
    assert usage.held["actor:SharedSparkExecutors"] == {"count": 1, "seconds": 3.5, "cpu_seconds": 7.0}
    assert usage.cpu_seconds_reserved == 7.0
    _usage.start()  # the next job starts with nothing borrowed
    assert _usage.report().cpu_seconds_reserved == 0.0
