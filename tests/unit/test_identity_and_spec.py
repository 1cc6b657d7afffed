"""Deterministic remote names, and the spec/result contract between the two sides."""

from __future__ import annotations

import pytest

from emr_ray import spec
from emr_ray.identity import TaskIdentity


def test_names_are_stable_across_tries_except_the_submission_id():
    first = TaskIdentity("retrain_tabular", "manual__2026-11-02T00:00:00+00:00", "train", -1, 1)
    retry = TaskIdentity("retrain_tabular", "manual__2026-11-02T00:00:00+00:00", "train", -1, 2)
    assert first.run_name == retry.run_name
    assert first.checkpoint_path("file:///ck") == retry.checkpoint_path("file:///ck")
    assert first.submission_id() != retry.submission_id()
    assert first.submission_id().endswith("-t1")


def test_names_differ_between_runs_tasks_and_map_indexes():
    base = TaskIdentity("d", "r1", "t")
    others = [TaskIdentity("d", "r2", "t"), TaskIdentity("d", "r1", "u"), TaskIdentity("d", "r1", "t", 3)]
    assert len({base.run_name, *(o.run_name for o in others)}) == 4


def test_checkpoint_path_layout():
    identity = TaskIdentity("retrain", "scheduled__2026-11-02T00:00:00+00:00", "train")
    assert identity.checkpoint_path("cos://b/root/") == (
        "cos://b/root/checkpoints/retrain/scheduled__2026-11-02T00-00-00-00-00/train"
    )


def test_submission_ids_use_only_characters_ray_accepts():
    identity = TaskIdentity("my dag/with:odd chars", "manual__2026-11-02T00:00:00+00:00", "train")
    assert all(c.isalnum() or c in "-_." for c in identity.submission_id())


def test_spec_round_trips_through_the_entrypoint():
    payload = {"partition": "2026-11-02", "config": {"lr": 0.001, "columns": ["a", "b"]}}
    command = spec.entrypoint("emr_ray.jobs.train", payload)
    assert command.startswith("python -m emr_ray.jobs.train --spec-b64 ")
    assert spec.decode_spec(command.rsplit(" ", 1)[1]) == payload


def test_a_marker_after_a_progress_bar_on_the_same_line_is_found():
    logs = '[Stage 5:>      (0 + 1) / 1]\r          \rEMR_RAY_RESULT {"rows": 3}\n'
    assert spec.parse_marked(logs, spec.RESULT_MARKER) == {"rows": 3}


def test_the_last_marked_line_is_the_result():
    logs = 'noise\nEMR_RAY_RESULT {"a": 1}\nmore\nEMR_RAY_RESULT {"a": 2}\n'
    assert spec.parse_marked(logs, spec.RESULT_MARKER) == {"a": 2}
    assert spec.parse_marked("nothing", spec.ERROR_MARKER) is None


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("include.models.tabular", "not an import path"),
        ("no_such_module_x:f", "Cannot import"),
        ("include.models.tabular:nope", "has no 'nope'"),
    ],  # fmt: skip
)
def test_import_by_path_errors_name_the_path(path, message):
    with pytest.raises(ValueError, match=message):
        spec.import_by_path(path)
