"""The partition Param: the trigger form and the API accept exactly the dates the operators accept; and
the partition a run processes, as its tasks' templates and its MLflow tags name it."""

from __future__ import annotations

import re

import jinja2
import jsonschema
import pytest

from emr_ray.cluster import storage
from emr_ray.params import (
    ARRIVAL_CONF_VARIABLE,
    PARTITION_PATTERN,
    PARTITION_TEMPLATE,
    RETRY_DELAY_ENV,
    arrival_conf,
    committed_generation,
    committed_output,
    partition_of,
    partition_param,
    run_partition,
    run_type,
    task_defaults,
)
from tests.unit.run_contexts import KINDS, RunKind


@pytest.mark.parametrize("value", ["2026-11-02", "2020-01-31", None])
def test_dates_and_empty_are_accepted(value):
    partition_param().resolve(value)


@pytest.mark.parametrize(
    "value", ["2026-11-02\n", "２０２６-11-02", "2026-13-01", "2026-11-2", "x2026-11-02"]
)
def test_what_the_operators_refuse_the_form_refuses_too(value):
    with pytest.raises(Exception, match="Invalid input|does not match"):
        partition_param().resolve(value)
    with pytest.raises(storage.StorageError):
        storage.validate_partition(value)


def test_the_pattern_means_the_same_in_python_and_as_a_json_schema():
    jsonschema.validate("2026-11-02", {"type": "string", "pattern": PARTITION_PATTERN})
    assert re.search(PARTITION_PATTERN, "2026-11-02\n") is None


def test_downstream_tasks_read_what_this_runs_preprocessing_committed():
    assert (
        committed_output("preprocess", "train")
        == "{{ ti.xcom_pull(task_ids='preprocess')['outputs']['train'] }}"
    )
    assert committed_generation("preprocess") == "{{ ti.xcom_pull(task_ids='preprocess')['generation'] }}"


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)
def test_run_partition_is_what_the_partition_template_renders(kind: RunKind):
    """The tags that default to :func:`run_partition` name the partition the DAG's tasks process."""
    context = kind.context()
    template = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(PARTITION_TEMPLATE)
    assert run_partition(context) == template.render(**context) == kind.partition


def test_a_dag_without_a_partition_param_renders_its_runs_date():
    """An operator's default (``RayBatchPredictOperator.partition``) in a DAG that has no ``partition``
    param: a scheduled run's partition, not an undefined-variable error."""
    (kind,) = [k for k in KINDS if k.name == "scheduled"]
    context = kind.context(partition_param=False)
    template = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(PARTITION_TEMPLATE)
    assert template.render(**context) == kind.partition


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_run_type_is_the_plain_value_of_the_task_sdks_enum(kind: RunKind):
    """A task's ``dag_run.run_type`` is an enum whose ``str()`` is ``DagRunType.BACKFILL``: read as
    text, a backfill never looked like one, and its registrations replaced the champion."""
    context = kind.context()
    assert run_type(context) == kind.run_type
    assert str(context["dag_run"].run_type) != kind.run_type  # why the value is taken
    assert run_type({}) == ""


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)
def test_every_reader_of_a_run_names_the_partition_its_tasks_process(kind: RunKind):
    """One rule (:func:`partition_of`) for the task context, the Retraining view (plain records), the
    audit and the deadline alert (the REST API's run, dates as ISO text)."""
    from emr_ray.audit.rules import run_partition as audited
    from emr_ray.deadlines import describe_miss

    context = kind.context()
    run = context["dag_run"]
    as_rest = {"conf": {"partition": context["params"].get("partition")}, "run_after": run.run_after.isoformat(),
               "logical_date": run.logical_date.isoformat() if run.logical_date else None}  # fmt: skip
    assert partition_of(context["params"].get("partition"), run.logical_date, run.run_after) == kind.partition
    assert audited(as_rest) == kind.partition
    assert f"(partition {kind.partition}," in describe_miss({"dag_run": as_rest})


def test_a_context_without_any_date_has_no_partition():
    assert run_partition({"params": {}}) is None
    assert run_partition({"ds": "2026-11-02"}) == "2026-11-02"


def test_a_task_retries_soon_then_three_times_later_unless_the_environment_sets_a_constant_delay(monkeypatch):
    monkeypatch.delenv(RETRY_DELAY_ENV, raising=False)
    defaults = task_defaults()
    assert defaults["retries"] == 2 and defaults["retry_delay"].total_seconds() == 20
    assert defaults["retry_exponential_backoff"] == 3.0 and defaults["max_retry_delay"].total_seconds() == 600
    monkeypatch.setenv(RETRY_DELAY_ENV, "10")
    defaults = task_defaults(retries=1)
    assert defaults["retry_delay"].total_seconds() == 10 and "retry_exponential_backoff" not in defaults
    monkeypatch.setenv(RETRY_DELAY_ENV, "2m")
    with pytest.raises(ValueError, match="EMR_RAY_RETRY_DELAY='2m' is not a number of seconds"):
        task_defaults()


def test_the_dags_retries_come_20_to_40_s_then_60_to_120_s_after_a_failure():
    """Airflow's own arithmetic (``TaskInstance.next_retry_datetime``) on the defaults: the first retry
    soon, for a failure that costs nothing to retry; the second after a restarted component is back."""
    import datetime as dt
    from types import SimpleNamespace

    from airflow.models.taskinstance import TaskInstance

    task = SimpleNamespace(**{k: v for k, v in task_defaults().items() if k != "owner"})
    end = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    waits = []
    for try_number in (1, 2):
        ti = SimpleNamespace(task=task, try_number=try_number, end_date=end, retry_delay_override=None,
                             dag_id="retrain_tabular", task_id="train", logical_date=end, log=None)  # fmt: skip
        waits.append((TaskInstance.next_retry_datetime(ti) - end).total_seconds())
    assert 20 <= waits[0] < 40 and 60 <= waits[1] < 120


@pytest.mark.parametrize("variable", [None, "", "  "])
def test_an_arrivals_run_without_the_variable_gets_its_partition_and_the_dags_defaults(variable):
    assert arrival_conf("2026-12-01", variable) == {"partition": "2026-12-01"}


def test_the_arrival_variables_params_join_each_arrivals_partition():
    assert arrival_conf("2026-12-01", '{"epochs": 1, "num_workers": 1}') == {
        "epochs": 1, "num_workers": 1, "partition": "2026-12-01"
    }  # fmt: skip


@pytest.mark.parametrize(
    ("variable", "why"),
    [("{epochs: 1}", "is not JSON"), ("[1]", "is a JSON list, not an object"),
     ('{"partition": "2026-01-01"}', "sets 'partition'")],
)  # fmt: skip
def test_a_bad_arrival_variable_is_refused_naming_it_and_the_fix(variable, why):
    with pytest.raises(ValueError, match=f"{ARRIVAL_CONF_VARIABLE} Variable {why}") as refused:
        arrival_conf("2026-12-01", variable)
    assert "remove it" in str(refused.value) or "delete it" in str(refused.value)
