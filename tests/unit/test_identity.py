"""Deterministic remote names: the same on every try where resuming needs it, distinct elsewhere."""

from __future__ import annotations

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
