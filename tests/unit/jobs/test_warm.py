"""How a job picks a warm pool (``emr_ray.jobs.warm.serve``): a free replica first, another replica
when all are busy and the cluster has room, else wait. The cluster's side (which replicas are alive,
whether CPUs are free) is a small stand-in here, as this is the choosing logic alone; the real pools
on a real cluster: ``tests/integration/test_spark_session.py`` and ``test_train_group.py``.
"""

from __future__ import annotations

import pytest

from emr_ray.jobs import warm

KEY = "train-0123456789abcdef0123"


class Cluster:
    """Replicas by name with a busy flag, and whether another one would fit."""

    def __init__(self, busy: dict[str, bool], room: bool) -> None:
        self.busy, self.room, self.calls = dict(busy), room, []

    def attempt(self, name: str) -> str | None:
        self.calls.append(name)
        if self.busy.setdefault(name, False):
            return None
        self.busy[name] = True
        return name


@pytest.fixture
def cluster(monkeypatch):
    def make(busy: dict[str, bool], room: bool) -> Cluster:
        c = Cluster(busy, room)
        monkeypatch.setattr(warm, "replicas", lambda namespace, key: sorted(c.busy))
        monkeypatch.setattr(warm, "_room_for", lambda cpus, key: c.room)
        return c

    return make


def test_extra_replicas_give_the_cluster_back_within_a_minute():
    assert warm.idle_timeout(f"{KEY}-0", 600) == 600
    assert warm.idle_timeout(f"{KEY}-1", 600) == 60 and warm.idle_timeout(f"{KEY}-3", 30) == 30


def test_a_free_replica_serves_the_call(cluster):
    c = cluster({f"{KEY}-0": True, f"{KEY}-1": False}, room=True)
    assert warm.serve("ns", KEY, 2, c.attempt, what="group") == f"{KEY}-1"
    assert c.calls == [f"{KEY}-0", f"{KEY}-1"]


def test_the_first_call_waits_a_while_for_room_then_starts_replica_0_anyway(cluster, monkeypatch):
    c = cluster({}, room=False)
    slept: list[float] = []
    monkeypatch.setattr(warm.time, "sleep", slept.append)
    assert warm.serve("ns", KEY, 2, c.attempt, what="group", poll_s=10) == f"{KEY}-0"
    assert sum(slept) == warm.ROOM_WAIT_S


def test_the_first_call_starts_replica_0_at_once_when_there_is_room(cluster):
    c = cluster({}, room=True)
    assert warm.serve("ns", KEY, 2, c.attempt, what="group") == f"{KEY}-0"


def test_all_busy_with_room_starts_the_lowest_free_number(cluster):
    c = cluster({f"{KEY}-0": True, f"{KEY}-2": True}, room=True)
    assert warm.serve("ns", KEY, 2, c.attempt, what="group") == f"{KEY}-1"


def test_all_busy_without_room_waits_for_one(cluster, monkeypatch):
    c = cluster({f"{KEY}-0": True}, room=False)
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the busy replica finishes while the job waits
        slept.append(seconds)
        c.busy[f"{KEY}-0"] = False

    monkeypatch.setattr(warm.time, "sleep", sleep)
    assert warm.serve("ns", KEY, 2, c.attempt, what="group") == f"{KEY}-0"
    assert slept == [1.0]
