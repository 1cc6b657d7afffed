"""RayJobTrigger's serialized form: what the triggerer stores and rebuilds it from. Its run against a
real Ray head (events, retries through a fault proxy, deadlines) is in ``tests/integration``."""

from __future__ import annotations

import importlib

from emr_ray.triggers.ray import RayJobTrigger


def rebuild(trigger: RayJobTrigger) -> RayJobTrigger:
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)(**kwargs)


def test_serialize_round_trips_every_setting():
    trigger = RayJobTrigger(submission_id="airflow-x-t1", ray_conn_id="ray_default", poll_interval=2.0,
                            deadline=1_800_000_000.0, pending_deadline=1_700_000_000.0, pending_timeout=1800.0,
                            monitor_retry_seconds=600.0, answer_after=1_700_000_005.0)  # fmt: skip
    path, kwargs = trigger.serialize()
    assert path == "emr_ray.triggers.ray.RayJobTrigger"
    assert rebuild(trigger).serialize() == (path, kwargs)
    assert kwargs["monitor_retry_seconds"] == 600.0 and kwargs["pending_deadline"] == 1_700_000_000.0
    assert kwargs["answer_after"] == 1_700_000_005.0


def test_a_trigger_stored_by_the_previous_version_still_rebuilds():
    """Deferred tasks survive an upgrade: the old kwargs lack the pending deadline, the retry budget and
    the settle."""
    old = {
        "submission_id": "airflow-x-t1",
        "ray_conn_id": "ray_default",
        "poll_interval": 5.0,
        "deadline": None,
    }
    trigger = RayJobTrigger(**old)
    assert trigger.pending_deadline is None and trigger.monitor_retry_seconds == 0.0
    assert trigger.answer_after is None  # answers as soon as the job ends
