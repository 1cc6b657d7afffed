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


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_run_type_is_the_plain_value_of_the_task_sdks_enum(kind: RunKind):
    """A task's ``dag_run.run_type`` is an enum whose ``str()`` is ``DagRunType.BACKFILL``: read as
    text, a backfill never looked like one, and its registrations replaced the champion."""
    context = kind.context()
    assert run_type(context) == kind.run_type
    assert str(context["dag_run"].run_type) != kind.run_type  # why the value is taken
    assert run_type({}) == ""


def test_a_context_without_any_date_has_no_partition():
    assert run_partition({"params": {}}) is None
    assert run_partition({"ds": "2026-11-02"}) == "2026-11-02"


def test_every_task_retries_two_minutes_apart_unless_the_environment_says_otherwise(monkeypatch):
    monkeypatch.delenv(RETRY_DELAY_ENV, raising=False)
    assert task_defaults()["retries"] == 2 and task_defaults()["retry_delay"].total_seconds() == 120
    monkeypatch.setenv(RETRY_DELAY_ENV, "10")
    assert task_defaults(retries=1)["retry_delay"].total_seconds() == 10
    monkeypatch.setenv(RETRY_DELAY_ENV, "2m")
    with pytest.raises(ValueError, match="EMR_RAY_RETRY_DELAY='2m' is not a number of seconds"):
        task_defaults()


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
