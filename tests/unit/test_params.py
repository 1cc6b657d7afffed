"""The partition Param: the trigger form and the API accept exactly the dates the operators accept."""

from __future__ import annotations

import re

import jsonschema
import pytest

from emr_ray.cluster import storage
from emr_ray.params import PARTITION_PATTERN, committed_generation, committed_output, partition_param


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
