"""How a job picks a warm pool (``emr_ray.cluster.warm.lease.serve``): a free replica first; when all are busy,
a wait for one (as long as another would take to start), then another replica if the cluster has
room, else wait. The cluster's side (which replicas are alive,
whether CPUs are free) is a small stand-in here, as this is the choosing logic alone; the real pools
on a real cluster: ``tests/integration/test_spark_session.py`` and ``test_train_group.py``.
"""

from __future__ import annotations

import pytest

from emr_ray.cluster.warm import lease as warm
from emr_ray.cluster.warm import registry
from emr_ray.cluster.warm.actor import wait_while
from emr_ray.cluster.warm.policy import DEFAULT, PoolPolicy

KEY = "train-0123456789abcdef0123"


class Cluster:
    """Replicas by name with a busy flag, and whether another one would fit. ``frees_while_waited``:
    the replicas whose call ends while a job waits for them."""

    def __init__(self, busy: dict[str, bool], room: bool, frees_while_waited: tuple[str, ...] = ()) -> None:
        self.busy, self.room, self.calls, self.waits = dict(busy), room, [], []
        self.frees = set(frees_while_waited)

    def attempt(self, name: str, wait_s: float) -> str | None:
        self.calls.append(name)
        if wait_s:
            self.waits.append(name)
            if name in self.frees:
                self.busy[name] = False
        if self.busy.setdefault(name, False):
            return None
        self.busy[name] = True
        return name


@pytest.fixture
def cluster(monkeypatch):
    def make(busy: dict[str, bool], room: bool, frees_while_waited: tuple[str, ...] = ()) -> Cluster:
        c = Cluster(busy, room, frees_while_waited)
        monkeypatch.setattr(registry, "replicas", lambda namespace, key: sorted(c.busy))
        monkeypatch.setattr(warm, "_room_for", lambda cpus, key, evict: c.room)
        return c

    return make


def test_extra_replicas_give_the_cluster_back_within_a_minute():
    policy = DEFAULT.idle_after(600)
    assert policy.idle_timeout(f"{KEY}-0") == 600 and policy.idle_timeout(f"{KEY}-1") == 60
    assert DEFAULT.idle_after(30).idle_timeout(f"{KEY}-3") == 30


@pytest.mark.parametrize(
    "numbers, refused",
    [
        ({"idle_timeout_s": 0}, "idle_timeout_s=0: use a positive number"),
        ({"beat_s": 30.0}, "beat_s=30.0 must be shorter than lease_timeout_s=30.0"),
        ({"lease_grace_s": 10.0}, "lease_grace_s=10.0 must be at least lease_timeout_s=30.0"),
    ],
)
def test_a_pool_policy_refuses_numbers_that_break_the_lifecycle(numbers, refused):
    with pytest.raises(ValueError, match=refused):
        PoolPolicy(**numbers)


def test_a_free_replica_serves_the_call(cluster):
    c = cluster({f"{KEY}-0": True, f"{KEY}-1": False}, room=True)
    assert warm.serve("ns", KEY, 2, c.attempt, what="group") == f"{KEY}-1"
    assert c.calls == [f"{KEY}-0", f"{KEY}-1"]


def test_the_first_call_waits_a_while_for_room_then_starts_replica_0_anyway(cluster, monkeypatch):
    c = cluster({}, room=False)
    slept: list[float] = []
    monkeypatch.setattr(warm.time, "sleep", slept.append)
    assert warm.serve("ns", KEY, 2, c.attempt, what="group", poll_s=10) == f"{KEY}-0"
    assert sum(slept) == DEFAULT.room_wait_s


def test_the_first_call_starts_replica_0_at_once_when_there_is_room(cluster):
    c = cluster({}, room=True)
    assert warm.serve("ns", KEY, 2, c.attempt, what="group") == f"{KEY}-0"


def test_all_busy_with_room_waits_once_for_a_busy_one_then_starts_the_lowest_free_number(cluster):
    c = cluster({f"{KEY}-0": True, f"{KEY}-2": True}, room=True)
    assert warm.serve("ns", KEY, 2, c.attempt, what="group") == f"{KEY}-1"
    assert c.waits == [f"{KEY}-0"]  # the replica caps the wait at its own start-up time


def test_a_busy_replica_whose_call_ends_first_serves_the_call_and_none_starts(cluster):
    """A call ends in seconds; another replica takes longer to start: waiting for it is cheaper."""
    c = cluster({f"{KEY}-0": True}, room=True, frees_while_waited=(f"{KEY}-0",))
    assert warm.serve("ns", KEY, 2, c.attempt, what="group") == f"{KEY}-0"
    assert sorted(c.busy) == [f"{KEY}-0"]


def test_a_live_replica_whose_call_ends_while_a_new_one_starts_serves_the_call(cluster):
    """All busy, with room: the job waits once, then starts another; the live one's call ends while
    the new one starts, so the live one serves the job (the new one lives on for the next)."""
    c = cluster({f"{KEY}-0": True}, room=True)
    polls: list[float] = []

    def begin(name: str):
        c.busy[name] = False  # a replica of the pool from now on, still starting

        def ready(timeout: float) -> bool:
            polls.append(timeout)
            if len(polls) == 2:
                c.busy[f"{KEY}-0"] = False  # the live one's call ends during the second poll
            return len(polls) > 5

        return ready

    assert warm.serve("ns", KEY, 2, c.attempt, what="group", begin=begin) == f"{KEY}-0"
    assert polls == [1.0, 1.0] and c.waits == [f"{KEY}-0"]
    assert c.calls.count(f"{KEY}-1") == 0  # the new one was never asked for the call


def test_all_busy_without_room_waits_for_one(cluster, monkeypatch):
    c = cluster({f"{KEY}-0": True}, room=False)
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the busy replica finishes while the job waits
        slept.append(seconds)
        c.busy[f"{KEY}-0"] = False

    monkeypatch.setattr(warm.time, "sleep", sleep)
    assert warm.serve("ns", KEY, 2, c.attempt, what="group") == f"{KEY}-0"
    assert slept == [1.0]


def test_a_spark_job_never_starts_a_second_session_while_its_first_lives(cluster, monkeypatch):
    """RayDP names a session's app master once per Ray namespace (the job's): the replica this job
    started was taken by another job as it came up, so this job waits for a live one instead of
    starting ``-1`` (which would fail on the name)."""
    c = cluster({}, room=True)
    taken_as_started = f"{KEY}-0"
    attempt = c.attempt

    def attempt_where_another_job_is_faster(name: str, wait_s: float) -> str | None:
        if name == taken_as_started and name not in c.busy:
            c.calls.append(name)
            c.busy[name] = True  # started by this job, served another first
            return None
        return attempt(name, wait_s)

    def sleep(seconds: float) -> None:  # the other job's call ends
        c.busy[taken_as_started] = False

    monkeypatch.setattr(warm.time, "sleep", sleep)
    got = warm.serve(
        "ns", KEY, 2, attempt_where_another_job_is_faster, what="Spark session", one_per_job=True
    )
    assert got == taken_as_started and sorted(c.busy) == [taken_as_started]


def test_a_waiting_call_starts_as_soon_as_the_call_before_it_ends_and_gives_up_at_its_bound():
    """The replica's side of the wait: woken by the end of the running call, not by a poll; a call
    still running at the bound leaves the waiter to try elsewhere."""
    import threading
    import time

    cond, state = threading.Condition(), {"busy": True}

    def finish_after(seconds: float) -> None:
        time.sleep(seconds)
        with cond:
            state["busy"] = False
            cond.notify_all()

    threading.Thread(target=finish_after, args=(0.2,), daemon=True).start()
    started = time.monotonic()
    with cond:
        wait_while(cond, lambda: state["busy"], 30.0)
    assert not state["busy"] and time.monotonic() - started < 5

    state["busy"] = True
    started = time.monotonic()
    with cond:
        wait_while(cond, lambda: state["busy"], 0.3)
    assert state["busy"] and 0.3 <= time.monotonic() - started < 5


def test_only_a_job_without_a_replica_of_its_kind_evicts_other_idle_pools_to_make_room(cluster, monkeypatch):
    """Adding a second replica would evict another kind's idle pool, whose next job then starts it
    again (12-40 s): a job that has a replica to wait for never evicts; one with none may."""
    asked: list[bool] = []
    c = cluster({f"{KEY}-0": True}, room=True)  # one replica, busy: this job would scale out
    monkeypatch.setattr(warm, "_room_for", lambda cpus, key, evict: asked.append(evict) or True)
    assert warm.serve("ns", KEY, 2, c.attempt, what="group") == f"{KEY}-1"
    assert asked == [False]

    asked.clear()
    first = cluster({}, room=True)  # no replica of this kind yet
    monkeypatch.setattr(warm, "_room_for", lambda cpus, key, evict: asked.append(evict) or True)
    assert warm.serve("ns", KEY, 2, first.attempt, what="group") == f"{KEY}-0"
    assert asked == [True]


def test_a_pool_calls_log_lines_go_to_the_job_once_and_travel_with_its_failure(caplog):
    """The call's lines go to the job (which prints them), not also to the actor's own output (the job
    that created the pool printed them twice); a failing call carries them in its exception."""
    import logging

    import pytest

    from emr_ray.cluster.warm.call_log import CallLog

    with caplog.at_level(logging.INFO), CallLog.capture() as lines:
        logging.getLogger("emr_ray.cluster.jobs.compare").info("tabular-mlp@champion does not exist yet")
    assert len(lines) == 1 and lines[0].endswith(
        "INFO emr_ray.cluster.jobs.compare: tabular-mlp@champion does not exist yet"
    )
    assert "does not exist yet" not in caplog.text  # the root (the actor's output) never saw it
    assert logging.getLogger("emr_ray").propagate  # as it was, after the call

    with pytest.raises(RuntimeError) as failed, CallLog.capture():
        logging.getLogger("include.models.tabular").info("epoch 3: loss went to nan")
        raise RuntimeError("the loop failed")
    assert "epoch 3: loss went to nan" in failed.value.__notes__[0]
