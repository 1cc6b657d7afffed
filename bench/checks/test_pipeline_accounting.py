"""The pipeline benchmark's accounting (``bench/pipeline.py``), checked beside it (the provider's tests never
import ``bench/``): ``airflow dags test`` starts its in-process
execution API when its first task starts; those seconds are the harness's, not the first task's."""

from __future__ import annotations

from bench.pipeline import lane_gaps, task_started, utilisation_ceiling, without_harness

LOG = """\
2026-12-05T02:05:56.465714Z [info     ] [DAG TEST] running task <TaskInstance: retrain_tabular.wait_for_partition>
2026-12-05T02:06:00.218434Z [info     ] Task started                   [airflow.api_fastapi] loc=x.py:226 previous_state=queued ti_id=01a243f3-6d3d-7d76-8b8d-8d7363f1f3d8
2026-12-05T02:06:00.928226Z [info     ] Task started                   [airflow.api_fastapi] loc=x.py:226 previous_state=queued ti_id=01a243f3-6d3e-726c-ba45-83605dce94cf
"""  # noqa: E501


def test_each_task_starts_where_its_own_code_started_and_the_harness_seconds_are_counted_apart():
    start = task_started(LOG)
    sensor_started = start["01a243f36d3d7d768b8d8d7363f1f3d8"]
    tis = {
        # as the metadata database stores them: ids without dashes, the first task "started" early
        "wait_for_partition": {"start": sensor_started - 2.7, "end": sensor_started + 0.15,
                               "id": "01a243f36d3d7d768b8d8d7363f1f3d8"},
        "check_cluster": {"start": sensor_started + 0.72, "end": sensor_started + 0.86,
                          "id": "01a243f36d3e726cba4583605dce94cf"},
        "unlogged": {"start": 5.0, "end": 6.0, "id": "ffff"},
    }  # fmt: skip
    assert round(without_harness(tis, start), 2) == 2.7
    assert round(tis["wait_for_partition"]["end"] - tis["wait_for_partition"]["start"], 2) == 0.15
    assert round(tis["check_cluster"]["end"] - tis["check_cluster"]["start"], 2) == 0.14  # unchanged
    assert tis["unlogged"]["start"] == 5.0


def test_a_lanes_idle_seconds_are_split_into_airflows_side_and_the_jobs_way_to_the_pool():
    """Three calls on one pool: the second job was waiting before the first ended (its 1 s gap is its
    own way to the pool); the third was submitted 3 s after the second ended, and its 4 s gap is
    those 3 s of Airflow's side and 1 s of its own."""
    jobs = [
        {"submitted": 100.0, "ended": 110.0, "held_s": 8.0, "idle_before_s": 50.0},
        {"submitted": 105.0, "ended": 121.0, "held_s": 9.0, "idle_before_s": 1.0},
        {"submitted": 124.0, "ended": 135.0, "held_s": 6.0, "idle_before_s": 4.0},
    ]
    lane = lane_gaps(jobs, wall=46.0)
    assert lane == {"calls": 3, "busy_s": 23.0, "busy_share": 0.5, "not_submitted_s": 3.0, "job_start_s": 2.0}


def test_the_ceiling_is_the_utilisation_with_the_busiest_lane_never_idle():
    """120 CPU-s reserved on 3 CPUs; the training lane's calls took 50 s, the Spark lane's 20 s: at
    best the wall is 50 s, so 80%; a measured 60% then means the training lane was busy 75% of it."""
    lanes = {"preprocess": {"busy_s": 20.0}, "train": {"busy_s": 50.0}}
    assert utilisation_ceiling(120.0, 3.0, lanes) == {"lane": "train", "busy_s": 50.0, "utilisation": 0.8}
    assert utilisation_ceiling(120.0, 3.0, {}) == {}  # the cold path: no warm lane


def test_airflows_cpu_seconds_are_each_components_difference_between_two_readings():
    from bench.pipeline import cpu_spent

    before = {"scheduler": 10.0, "triggerer": 2.0}
    after = {"scheduler": 25.5, "triggerer": 2.4, "worker-1": 7.0}  # a component started in between
    assert cpu_spent(before, after) == {"scheduler": 15.5, "triggerer": 0.4, "worker-1": 7.0}


def test_retried_tries_count_each_tasks_tries_beyond_its_first():
    from bench.pipeline import retried_tries

    tis = [{"task_id": "train", "try_number": 2}, {"task_id": "train", "try_number": 1},
           {"task_id": "preprocess", "try_number": 3}, {"task_id": "register", "try_number": None}]  # fmt: skip
    assert retried_tries(tis) == {"train": 1, "preprocess": 2}


def test_task_processes_count_every_start_and_resume_of_the_backfills_runs_only():
    from bench.pipeline import task_processes

    events = [{"run_id": "b1", "task_id": "train"}, {"run_id": "b1", "task_id": "train"},  # started, resumed
              {"run_id": "b1", "task_id": "register"}, {"run_id": "manual", "task_id": "train"},
              {"run_id": "b2", "task_id": None}]  # fmt: skip
    assert task_processes(events, {"b1", "b2"}) == {"train": 2, "register": 1}
