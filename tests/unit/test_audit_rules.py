"""The chaos audit's rules (``emr_ray/audit/rules.py``) on tiny data: what counts as lost, duplicated,
orphaned, misdecided or leaked, and the table whose lines must all be 0."""

from __future__ import annotations

import json

import pytest

from emr_ray.audit.rules import (
    Finding,
    PartitionState,
    VersionState,
    check_champion,
    check_jobs,
    check_partition,
    check_versions,
    check_warm_pools,
    count_faults,
    exit_code,
    expected_champion,
    find_secrets,
    run_partition,
    table,
    totals,
)
from emr_ray.cluster.promotion import Comparison

GOOD = PartitionState("2026-11-02", raw_rows=100, current="g1", rows_in=100,
                      declared={"train": 80, "test": 20}, found={"train": 80, "test": 20})  # fmt: skip


def version(n: int, run: str, value: float, **kw) -> VersionState:
    fields = dict(mlflow_run_id=f"m{n}", airflow_run_id=run, data_uri="cos://b/staging/tabular/dt=2026-11-02",
                  generation=f"g{n}", generation_committed=True, run_found=True, run_matches=True, value=value,
                  partition="2026-11-02")  # fmt: skip
    return VersionState(str(n), **(fields | kw))


def parse(text: str) -> dict[str, int]:
    """The table's rows as ``{label: count}``."""
    cells = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("| ")][1:]
    return {label.strip(): int(count) for label, count in cells}


def lines(findings: list[Finding]) -> dict[str, int]:
    return {k: v for k, v in totals(findings).items() if v}


def test_a_date_whose_current_generation_holds_the_raw_rows_is_clean():
    assert check_partition(GOOD, idle_s=600) == []


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (PartitionState("2026-11-02", raw_rows=100, current=None), {"lost": 1}),
        (GOOD.__class__(**{**GOOD.__dict__, "found": {"train": 80, "test": None}}), {"lost": 1}),
        (
            GOOD.__class__(
                **{**GOOD.__dict__, "declared": {"train": 80, "test": 40}, "found": {"train": 80, "test": 40}}
            ),
            {"duplicated": 1},
        ),  # fmt: skip
        (GOOD.__class__(**{**GOOD.__dict__, "rows_in": 90}), {"lost": 1}),
        (GOOD.__class__(**{**GOOD.__dict__, "uncommitted": {"g0": 30.0, "g2": 700.0}}), {"orphaned": 1}),
    ],
    ids=[
        "no current generation",
        "a listed file gone",
        "rows written twice",
        "rows dropped on read",
        "a writer left its generation",
    ],  # fmt: skip
)
def test_a_date_that_lost_duplicated_or_left_data_counts_on_its_line(state, expected):
    assert lines(check_partition(state, idle_s=600)) == expected


def test_a_date_without_raw_data_and_without_output_is_not_lost():
    assert check_partition(PartitionState("2026-11-04", raw_rows=None, current=None), idle_s=600) == []


def test_each_model_version_names_a_committed_generation_and_its_own_run():
    clean = [version(1, "backfill__a", 0.9), version(2, "backfill__b", 0.8)]
    assert check_versions(clean, registered_runs={"backfill__a", "backfill__b"}) == []
    broken = [
        version(1, "backfill__a", 0.9, generation_committed=False),
        version(2, "backfill__b", 0.8, run_found=False),
        version(3, "backfill__b", 0.8, mlflow_run_id="m3"),
    ]
    findings = check_versions(broken, registered_runs={"backfill__a", "backfill__b", "backfill__c"})
    assert [(f.line, f.what) for f in findings] == [
        ("lost", "v1 names g1 of cos://b/staging/tabular/dt=2026-11-02, which is not committed"),
        ("lost", "v2: its MLflow run m2 does not exist"),
        ("duplicated", "Airflow run backfill__b has 2 versions (v2, v3)"),
        ("lost", "Airflow run backfill__c registered, but no version names it"),
    ]


def test_a_kept_versions_generation_must_be_whole_and_a_released_ones_may_be_gone():
    """A version the retention policy keeps whose generation lost a file or rows is lost; one the policy
    let go may have no data left (retention removed it by design)."""
    versions = [
        version(1, "backfill__a", 0.9, data_problem="output train holds 70 rows, its manifest declares 80"),
        version(2, "backfill__b", 0.8, kept=False, generation_committed=False),
    ]
    findings = check_versions(versions, registered_runs={"backfill__a", "backfill__b"})
    assert [(f.line, f.what) for f in findings] == [
        ("lost", "v1's generation g1: output train holds 70 rows, its manifest declares 80"),
    ]


def test_the_champion_is_replayed_in_registration_order_with_the_promotion_rule():
    """No champion: the first version takes it, even from a backfill; later backfill versions stay
    challengers however good (historical); a manual run promotes when it beats the champion."""
    versions = [version(1, "backfill__a", 0.80), version(2, "backfill__b", 0.95), version(3, "manual__c", 0.85),
                version(4, "manual__d", 0.84)]  # fmt: skip
    assert expected_champion(versions) == "3"
    assert expected_champion(versions, promote_historical=True) == "2"
    assert check_champion(versions, "3") == []
    [finding] = check_champion(versions, "2")
    assert (finding.line, finding.what) == ("misdecided", "champion is v2, the promotion rule picks v3")
    assert check_champion([], None) == []


def test_a_comparison_against_another_champion_never_promotes_in_the_replay():
    stale = Comparison(champion_version="7", rows=20, challenger_value=0.99, champion_value=0.5)
    versions = [version(1, "manual__a", 0.80), version(2, "manual__b", 0.99, comparison=stale)]
    assert expected_champion(versions) == "1"


def test_a_ray_job_running_for_a_finished_try_is_orphaned():
    def job(sid: str, status: str, task: str) -> dict:
        return {"submission_id": sid, "status": status, "metadata": {"airflow_dag_id": "d", "airflow_run_id": "r",
                "airflow_task_id": task, "airflow_try_number": "1"}}  # fmt: skip

    jobs = [job("a", "RUNNING", "train"), job("b", "RUNNING", "preprocess"), job("c", "SUCCEEDED", "register"),
            job("d", "PENDING", "gone"), {"submission_id": "e", "status": "RUNNING", "metadata": {}}]  # fmt: skip
    tries = {
        ("d", "r", "train"): "deferred",
        ("d", "r", "preprocess"): "failed",
        ("d", "r", "register"): "success",
    }
    assert [f.what for f in check_jobs(jobs, tries)] == [
        "b is RUNNING but d.r.preprocess try 1 is failed",
        "d is PENDING but d.r.gone try 1 is gone",
    ]


def test_an_earlier_trys_job_still_running_beside_a_later_trys_own_job_is_orphaned():
    """Keyed by try, not by task: the live later try hides nothing. A retry that reattached owns the
    earlier job (one job: no finding)."""

    def job(sid: str, try_number: str, task: str = "train") -> dict:
        return {"submission_id": sid, "status": "RUNNING", "metadata": {"airflow_dag_id": "d", "airflow_run_id": "r",
                "airflow_task_id": task, "airflow_try_number": try_number}}  # fmt: skip

    tries = {("d", "r", "train"): "deferred", ("d", "r", "preprocess"): "running"}
    jobs = [job("t1", "1"), job("t2", "2"), job("reattached", "1", "preprocess")]
    assert [f.what for f in check_jobs(jobs, tries)] == [
        "t1 of try 1 of d.r.train is still active beside try 2's job t2"
    ]


def test_a_warm_pool_alive_past_its_idle_timeout_after_the_last_job_is_orphaned():
    actors = [{"name": "spark-k-0", "namespace": "emr_ray_spark_sessions", "state": "ALIVE"},
              {"name": "train-k-0", "namespace": "emr_ray_train_groups", "state": "DEAD"}]  # fmt: skip
    ended = [{"status": "SUCCEEDED", "end_time": 1_000_000}]
    assert check_warm_pools(actors, ended, now_s=1_030, idle_s=60) == []  # still within its idle time
    [finding] = check_warm_pools(actors, ended, now_s=1_100, idle_s=60)
    assert finding.what == "emr_ray_spark_sessions/spark-k-0 is alive 100 s after the last job ended"
    running = [*ended, {"status": "RUNNING", "end_time": None}]
    assert check_warm_pools(actors, running, now_s=9_999, idle_s=60) == []  # a job may hold it


def test_a_secret_is_found_plain_or_url_quoted_and_never_printed():
    secret = "s3cr3t/with+chars"
    findings = find_secrets({"task.log": "key=s3cr3t%2Fwith%2Bchars", "ok.log": "nothing", "short": "abc"},
                            [secret, "abc"])  # fmt: skip
    assert [f.what for f in findings] == ["task.log holds a secret (17 characters, starts 's3c'...)"]
    assert secret not in findings[0].what


def test_a_runs_partition_is_its_param_else_its_logical_date_else_the_day_before_it_ran():
    assert (
        run_partition({"conf": {"partition": "2026-10-01"}, "logical_date": "2026-11-02T00:00:00Z"})
        == "2026-10-01"
    )
    assert run_partition({"conf": {}, "logical_date": "2026-11-02T00:00:00Z"}) == "2026-11-02"
    assert (
        run_partition({"conf": {}, "logical_date": None, "run_after": "2026-11-03T08:00:00Z"}) == "2026-11-02"
    )


def test_the_table_counts_faults_by_kind_and_fails_unless_every_line_is_zero():
    faults = count_faults([json.dumps({"kind": "kill_worker", "at_s": 3}), "", json.dumps({"kind": "cos_503"}),
                           json.dumps({"kind": "kill_worker"}), json.dumps({"kind": "pause_driver", "skipped": "none ran"}),
                           json.dumps({"kind": "kill_raylet", "error": "OSError"})])  # fmt: skip
    assert faults == {"cos_503": 1, "kill_worker": 2}
    rows = parse(table(faults, retries=4, findings=[]))
    assert rows == {"faults injected": 3, "cos_503": 1, "kill_worker": 2, "retries": 4, "lost (must be 0)": 0,
                    "duplicated (must be 0)": 0, "orphaned (must be 0)": 0, "misdecided (must be 0)": 0,
                    "leaked (must be 0)": 0}  # fmt: skip
    assert exit_code([]) == 0
    bad = [Finding("orphaned", "ray job", "x")]
    text = table(faults, 4, bad)
    assert parse(text)["orphaned (must be 0)"] == 1 and text.endswith("- orphaned: ray job: x")
    assert exit_code(bad) == 1
    with pytest.raises(ValueError, match="use one of lost"):
        Finding("mislaid", "x", "y")
