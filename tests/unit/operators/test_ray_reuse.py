"""When a retried or cleared task takes over an earlier try's Ray job
(``RayJobOperator._reattach_or_submit``), against a fake Jobs API and real partitions on ``file://``.

A clear after a change must recompute even when the spec is the same: a raw partition landed again
under the same URI, the champion the training compared with moved, the generation a preprocessing
committed pruned. A plain retry with nothing changed must still reattach (no second job). The real
Jobs API and Spark: ``tests/integration/test_spark_session.py``.

Why a fake Jobs API here: the unit layer runs without a Ray head (``make unit`` in under a minute);
it stands in only for job lookups and submits, and the decisions it drives are proved against the
real Jobs API in the integration tests named above.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from emr_ray.cluster import partitions
from emr_ray.cluster.results import SparkResult, TrainResult
from emr_ray.cluster.reuse import DIGEST_KEY, EXTERNAL_KEY, FORCE_ENV
from emr_ray.cluster.spec import RESULT_MARKER
from emr_ray.identity import TaskIdentity
from emr_ray.operators.ray import RayJobOperator
from emr_ray.operators.raydp import RayDPSparkOperator
from emr_ray.operators.torch import TorchTrainOperator

DAY = "2026-11-05"


class FakeJobsApi:
    """The Jobs API calls the operator makes to decide: jobs by submission id, their logs, submits, stops."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.logs: dict[str, str] = {}
        self.submitted: list[str] = []
        self.stopped: list[str] = []

    def get_job(self, submission_id: str) -> dict[str, Any] | None:
        return self.jobs.get(submission_id)

    def get_job_logs(self, submission_id: str, job: Any = None) -> str:
        return self.logs.get(submission_id, "")

    def submit_job(self, *, submission_id: str, metadata: dict[str, str], **kwargs: Any) -> str:
        self.jobs[submission_id] = {
            "status": "PENDING",
            "metadata": metadata,
            "runtime_env": kwargs["runtime_env"],
        }
        self.submitted.append(submission_id)
        return submission_id

    def stop_job(self, submission_id: str) -> bool:
        self.stopped.append(submission_id)
        return True

    def job_runtime_env(self, runtime_env: Any = None) -> dict[str, Any]:
        return dict(runtime_env or {})

    def job_url(self, submission_id: str) -> str:
        return f"http://127.0.0.1:8265/#/jobs/{submission_id}"

    def finish(self, submission_id: str, result: dict[str, Any], status: str = "SUCCEEDED") -> None:
        self.jobs[submission_id]["status"] = status
        self.logs[submission_id] = f"working...\n{RESULT_MARKER}{json.dumps(result)}\n"


def identity(try_number: int, task_id: str = "preprocess") -> TaskIdentity:
    return TaskIdentity("retrain_tabular", "manual__1", task_id, -1, try_number)


def run_try(op: RayJobOperator, api: FakeJobsApi, spec: dict[str, Any], try_number: int) -> str:
    """What a try does first: take over an earlier try's job or submit its own; the job it will wait for."""
    op.__dict__["hook"] = op.__dict__["_stop_hook"] = api
    return op._reattach_or_submit(identity(try_number, op.task_id), dict(spec), {})


def land_raw(root: Path, rows: int, mtime: float | None = None) -> str:
    """A producer lands ``dt=DAY`` under ``root``: one Parquet file, then ``_SUCCESS``; its URI."""
    folder = root / f"dt={DAY}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"x": list(range(rows))}), folder / "part-00000.parquet")
    (folder / "_SUCCESS").write_bytes(b"")
    if mtime is not None:
        for path in folder.iterdir():
            os.utime(path, (mtime, mtime))
    return f"file://{folder}"


def preprocess_operator(tmp_path: Path) -> RayDPSparkOperator:
    return RayDPSparkOperator(
        task_id="preprocess",
        preprocess="include.preprocessing.tabular:standardize",
        input_uri=f"file://{tmp_path}/raw",
        output_uri=f"file://{tmp_path}/staged",
        partition=DAY,
    )


def preprocess_spec(tmp_path: Path) -> dict[str, Any]:
    return {
        "input_uri": f"file://{tmp_path}/raw/dt={DAY}",
        "output_uri": f"file://{tmp_path}/staged/dt={DAY}",
    }


def commit_output(tmp_path: Path, rows: int) -> dict[str, Any]:
    """What a finished preprocessing returned: the generation it committed (really committed here)."""
    uri = f"file://{tmp_path}/staged/dt={DAY}"
    committed = partitions.write_tables(uri, {"train": pa.table({"x": list(range(rows))})}, {})
    return SparkResult(partition=DAY, input_uri=f"file://{tmp_path}/raw/dt={DAY}", output_uri=uri,
                       generation=committed.generation, outputs={"train": committed.output_uri("train")},
                       rows_in=rows).to_dict()  # fmt: skip


# -- preprocessing: the raw partition and the generation it committed -----------------------------
def test_a_retry_with_the_raw_partition_unchanged_reattaches_to_the_finished_job(tmp_path, capsys):
    api, spec = FakeJobsApi(), preprocess_spec(tmp_path)
    land_raw(tmp_path / "raw", 200)
    first = run_try(preprocess_operator(tmp_path), api, spec, 1)
    recorded = json.loads(api.jobs[first]["metadata"][EXTERNAL_KEY])
    assert list(recorded) == [f"the raw partition {spec['input_uri']}"]
    assert recorded[f"the raw partition {spec['input_uri']}"].startswith("2 files, ")
    api.finish(first, commit_output(tmp_path, 200))

    assert run_try(preprocess_operator(tmp_path), api, spec, 2) == first
    assert api.submitted == [first]
    assert "same external inputs" in capsys.readouterr().out


def test_a_raw_partition_landed_again_is_recomputed_even_with_the_same_spec(tmp_path, capsys):
    """The finding of issue 31 (item 5): a date's raw partition landed again with other rows, then
    preprocess cleared: the try must not return the generation of the old rows."""
    api, spec = FakeJobsApi(), preprocess_spec(tmp_path)
    land_raw(tmp_path / "raw", 200, mtime=time.time() - 3600)
    first = run_try(preprocess_operator(tmp_path), api, spec, 1)
    api.finish(first, commit_output(tmp_path, 200))
    land_raw(tmp_path / "raw", 120)

    second = run_try(preprocess_operator(tmp_path), api, spec, 2)
    assert second != first and api.submitted == [first, second]
    assert api.stopped == []  # a finished job needs no stop
    assert (
        f"Not reusing Ray job {first} of try 1 (SUCCEEDED): the raw partition {spec['input_uri']} changed since"
        in capsys.readouterr().out
    )
    # and a later try reuses the job that read the new rows
    assert run_try(preprocess_operator(tmp_path), api, spec, 3) == second


def test_a_file_landed_again_with_the_same_size_is_a_change_too(tmp_path):
    api, spec = FakeJobsApi(), preprocess_spec(tmp_path)
    land_raw(tmp_path / "raw", 200, mtime=1_700_000_000)
    first = run_try(preprocess_operator(tmp_path), api, spec, 1)
    api.finish(first, commit_output(tmp_path, 200))
    land_raw(tmp_path / "raw", 200, mtime=1_700_000_060)  # the same bytes, written again a minute later
    assert run_try(preprocess_operator(tmp_path), api, spec, 2) != first


def test_a_running_job_whose_raw_partition_changed_is_stopped_and_replaced(tmp_path):
    api, spec = FakeJobsApi(), preprocess_spec(tmp_path)
    land_raw(tmp_path / "raw", 200, mtime=time.time() - 3600)
    first = run_try(preprocess_operator(tmp_path), api, spec, 1)
    api.jobs[first]["status"] = "RUNNING"
    land_raw(tmp_path / "raw", 120)
    second = run_try(preprocess_operator(tmp_path), api, spec, 2)
    assert second != first and api.stopped == [first]


def test_a_finished_preprocessing_whose_generation_was_pruned_is_recomputed(tmp_path, capsys):
    """'Clear the preprocessing task of this run to produce it again' (what a reader of a pruned
    generation is told) must produce it again, not hand back the pruned generation."""
    import shutil

    api, spec = FakeJobsApi(), preprocess_spec(tmp_path)
    land_raw(tmp_path / "raw", 200)
    first = run_try(preprocess_operator(tmp_path), api, spec, 1)
    result = commit_output(tmp_path, 200)
    api.finish(first, result)
    shutil.rmtree(tmp_path / f"staged/dt={DAY}/_generations/{result['generation']}")  # its files pruned

    assert run_try(preprocess_operator(tmp_path), api, spec, 2) != first
    assert (
        f"the generation {result['generation']} it committed is gone or incomplete" in capsys.readouterr().out
    )


def test_a_job_that_recorded_no_external_inputs_is_not_reused_by_one_that_reads_some(tmp_path, capsys):
    api, spec = FakeJobsApi(), preprocess_spec(tmp_path)
    land_raw(tmp_path / "raw", 200)
    first = run_try(preprocess_operator(tmp_path), api, spec, 1)
    api.jobs[first]["metadata"].pop(EXTERNAL_KEY)  # as submitted by an earlier version of the provider
    api.finish(first, commit_output(tmp_path, 200))
    assert run_try(preprocess_operator(tmp_path), api, spec, 2) != first
    assert "its external inputs were not recorded" in capsys.readouterr().out


@pytest.mark.parametrize(
    "error",
    [
        OSError("connection reset"),
        OSError("AWS Error ACCESS_DENIED during ListObjectsV2 operation: HTTP status 403"),
    ],
)
def test_an_unreadable_raw_partition_is_never_evidence_for_reuse(tmp_path, monkeypatch, capsys, error):
    """A listing that failed says nothing about what the job read: no job is reused on it, and the
    new job reads the partition itself (refused keys: its own error names them, without retries)."""
    api, spec = FakeJobsApi(), preprocess_spec(tmp_path)
    land_raw(tmp_path / "raw", 200)

    def unreadable(self, spec):
        raise error

    monkeypatch.setattr(RayDPSparkOperator, "external_inputs", unreadable)
    first = run_try(preprocess_operator(tmp_path), api, spec, 1)
    api.finish(first, commit_output(tmp_path, 200))
    second = run_try(preprocess_operator(tmp_path), api, spec, 2)
    assert second != first and api.submitted == [first, second]
    assert "could not be compared" in capsys.readouterr().out


def test_force_recompute_and_final_states_still_reuse_nothing(tmp_path):
    api, spec = FakeJobsApi(), preprocess_spec(tmp_path)
    land_raw(tmp_path / "raw", 200)
    first = run_try(preprocess_operator(tmp_path), api, spec, 1)
    api.finish(first, commit_output(tmp_path, 200))
    assert run_try(preprocess_operator(tmp_path), api, spec, 2) == first
    forced = preprocess_operator(tmp_path)
    forced.force_recompute = True
    second = run_try(forced, api, spec, 2)
    assert second != first  # the finished job with the same spec is not taken, and its job is told so:
    assert api.jobs[second]["runtime_env"]["env_vars"][FORCE_ENV] == "1"  # it ignores stored results too
    api.finish(second, {}, status="FAILED")
    api.jobs[first]["status"] = "STOPPED"
    assert run_try(preprocess_operator(tmp_path), api, spec, 3) not in (first, second)


def test_a_job_without_external_inputs_reuses_on_the_digest_alone():
    api = FakeJobsApi()
    op = RayJobOperator(task_id="echo", spec={"payload": "x"})
    first = run_try(op, api, {"payload": "x"}, 1)
    assert EXTERNAL_KEY not in api.jobs[first]["metadata"] and api.jobs[first]["metadata"][DIGEST_KEY]
    api.finish(first, {"echo": "x"})
    assert run_try(RayJobOperator(task_id="echo", spec={"payload": "x"}), api, {"payload": "x"}, 2) == first


# -- ownership: a stale try's late on_kill ------------------------------------------------------------
class TaskInstanceXCom:
    """A try's view of its task instance's XCom, shared by all its tries as Airflow's table is."""

    def __init__(self, table: dict[str, Any], try_number: int, readable: bool = True) -> None:
        self.table, self.task_id, self.map_index, self.try_number = table, "echo", -1, try_number
        self.readable = readable

    def xcom_push(self, key: str, value: Any) -> None:
        self.table[key] = value

    def xcom_pull(self, task_ids: str, key: str, map_indexes: int) -> Any:
        if not self.readable:
            raise ConnectionError("the supervisor is gone")
        return self.table.get(key)


def owned_try(
    api: FakeJobsApi, table: dict[str, Any], try_number: int, readable: bool = True
) -> RayJobOperator:
    """A try that has submitted or taken over its job and said so (what ``execute`` does first)."""
    op = RayJobOperator(task_id="echo", spec={"payload": "x"})
    op._submission_id = run_try(op, api, {"payload": "x"}, try_number)
    op._claim(TaskInstanceXCom(table, try_number, readable), try_number)
    return op


def test_on_kill_of_a_try_whose_job_a_later_try_took_over_leaves_the_job_running():
    api, table = FakeJobsApi(), {}
    stale = owned_try(api, table, 1)
    successor = owned_try(api, table, 2)
    assert successor._submission_id == stale._submission_id  # taken over
    stale.on_kill()
    assert api.stopped == []
    successor.on_kill()  # the owner's own kill (a person marked it failed) stops it
    assert api.stopped == [stale._submission_id]


def test_on_kill_stops_the_job_when_nobody_took_it_over_or_nobody_can_say():
    api = FakeJobsApi()
    owned_try(api, {}, 1).on_kill()
    unsure = owned_try(api, {}, 1, readable=False)
    unsure.on_kill()
    assert api.stopped == [unsure._submission_id] * 2


def test_a_taken_over_job_stopped_before_its_successor_said_so_fails_the_successor_retryably():
    """The window before try 2's claim is readable: try 1's late on_kill stops the job; try 2 then
    fails retryably (STOPPED is otherwise final), and its retry submits a job of its own."""
    from airflow.sdk.exceptions import AirflowFailException

    from emr_ray.exceptions import RayJobTakenOverStoppedError

    api = FakeJobsApi()
    successor = owned_try(api, {}, 2)
    successor._own_submission_id = identity(2, "echo").submission_id()
    event = {"submission_id": identity(1, "echo").submission_id(), "status": "error", "reason": "stopped",
             "message": "ended STOPPED", "job_status": "STOPPED"}  # fmt: skip
    with pytest.raises(RayJobTakenOverStoppedError, match="the retry submits its own job") as raised:
        successor._finish(event)
    assert not isinstance(raised.value, AirflowFailException)


# -- training: the champion it compared with ------------------------------------------------------
class FakeRegistry:
    def __init__(self, aliases: dict[str, str] | None) -> None:
        self.aliases = aliases

    def get_aliases(self, name: str) -> dict[str, str]:
        if self.aliases is None:
            from mlflow.exceptions import MlflowException
            from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST

            raise MlflowException(f"Registered Model with name={name} not found", RESOURCE_DOES_NOT_EXIST)
        return dict(self.aliases)


TRAIN_SPEC = {
    "datasets": {"train": "file:///staged/g1/train"},
    "compare": {"model_name": "m", "alias": "champion"},
}


def train_try(api: FakeJobsApi, champion: dict[str, str] | None, try_number: int) -> str:
    op = TorchTrainOperator(task_id="train", train_loop="include.models.tabular:train_loop",
                            datasets=TRAIN_SPEC["datasets"], storage_path="file:///ckpt", compare_with_model="m")  # fmt: skip
    op.__dict__["mlflow_hook"] = FakeRegistry(champion)
    return run_try(op, api, TRAIN_SPEC, try_number)


def trained(comparison: dict[str, Any]) -> dict[str, Any]:
    """What a finished training returned (its XCom), with this comparison."""
    return TrainResult(mlflow_run_id="r1", tracking_uri="file:///mlruns", run_name="train",
                       checkpoint_uri="file:///ckpt/train/best", final_metrics={}, comparison=comparison).to_dict()  # fmt: skip


def compared(version: str | None) -> dict[str, Any]:
    return trained({"model_name": "m", "alias": "champion", "champion_version": version})


def test_a_cleared_training_whose_champion_moved_runs_a_new_job_so_register_can_decide(capsys):
    """Register refuses to promote on a comparison with another champion and says to clear the train
    task; that clear must not hand back the same comparison (it looped forever)."""
    api = FakeJobsApi()
    first = train_try(api, {"champion": "1"}, 1)
    api.finish(first, compared("1"))
    assert train_try(api, {"champion": "1"}, 2) == first  # a retry with the same champion reattaches
    second = train_try(api, {"champion": "2"}, 3)
    assert second != first
    assert "it compared with m@champion v1, which is v2 now" in capsys.readouterr().out


def test_a_training_that_found_no_champion_is_reused_while_there_still_is_none():
    api = FakeJobsApi()
    first = train_try(api, None, 1)
    api.finish(first, compared(None))
    assert train_try(api, None, 2) == first
    assert train_try(api, {"champion": "1"}, 3) != first


def test_a_training_whose_comparison_was_skipped_compares_again_in_a_new_job():
    api = FakeJobsApi()
    first = train_try(api, {"champion": "1"}, 1)
    api.finish(
        first, trained({"model_name": "m", "alias": "champion", "skipped": "the champion cannot be loaded"})
    )
    assert train_try(api, {"champion": "1"}, 2) != first


def test_a_deferrable_retry_of_a_finished_job_returns_its_result_without_deferring():
    """Issue 56: a try that takes over a job already done looks once before it defers, so it never
    defers at all (nor meets Airflow 3.3's deferral race, which retried such tries)."""
    api = FakeJobsApi()
    api.ship_packages = lambda runtime_env, **_: dict(runtime_env or {})  # nothing to ship here
    op = RayJobOperator(task_id="echo", spec={"payload": "x"})
    first = run_try(op, api, op.job_payload({}, identity(1, "echo")), 1)  # the payload execute() builds
    api.finish(first, {"echo": "x"})

    class Try:
        dag_id, run_id, task_id, map_index, try_number = "retrain_tabular", "manual__1", "echo", -1, 2
        xcom: dict[str, Any] = {}

        def xcom_push(self, key: str, value: Any) -> None:
            self.xcom[key] = value

    retry = RayJobOperator(task_id="echo", spec={"payload": "x"}, deferrable=True)  # defer_after 0
    retry.__dict__["hook"] = retry.__dict__["_stop_hook"] = api
    assert retry.execute({"ti": Try()})["echo"] == "x"  # no TaskDeferred
    assert api.submitted == [first]
