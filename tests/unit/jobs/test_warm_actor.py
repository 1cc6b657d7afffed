"""The one lifecycle of every warm pool (``emr_ray.cluster.warm``: the pool's side, then the job's): lease, heartbeat, idle
timeout, retire, give way and stop, on a payload that only records its start and stop, with a fake
clock (no sleeps, no threads, no cluster). The real pools on a real cluster:
``tests/integration/test_spark_session.py``, ``test_train_group.py`` and ``test_train_resume.py``.
"""

from __future__ import annotations

import pytest

from emr_ray.cluster.warm import lease as job_side
from emr_ray.cluster.warm import registry
from emr_ray.cluster.warm.actor import PoolFigures, PoolRetired, WarmActor
from emr_ray.cluster.warm.policy import DEFAULT, PoolPolicy

LEASE_TIMEOUT_S, LEASE_GRACE_S = DEFAULT.lease_timeout_s, DEFAULT.lease_grace_s

KEY = "train-0123456789abcdef0123"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Condition:
    """The pool's condition: a wait lets the fake time pass (and, once, the holder end its call)."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.waited, self.meanwhile = clock, [], None

    def __enter__(self) -> Condition:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def wait(self, timeout: float) -> None:
        self.waited.append(timeout)
        self.clock.advance(timeout)
        if self.meanwhile is not None:
            self.meanwhile, meanwhile = None, self.meanwhile
            meanwhile()

    def notify_all(self) -> None:
        pass


class Pool(WarmActor):
    """A payload that takes ``start_s`` to start and records its stop and the actor's exit."""

    NAMESPACE = "test_pools"
    WHAT = "Test pool"

    def __init__(self, name: str = f"{KEY}-0", idle_timeout_s: float = 600, start_s: float = 5.0) -> None:
        self.start_s, self.events, self.fault = start_s, [], None
        super().__init__(name, policy=DEFAULT.idle_after(idle_timeout_s), clock=Clock(), watch=False)
        self._cond = Condition(self.clock)

    def start(self) -> None:
        self.clock.advance(self.start_s)

    def stop(self) -> None:
        self.events.append("stop")

    def figures(self) -> PoolFigures:
        return PoolFigures(cpus=2.0)

    def broken(self) -> str | None:
        return self.fault

    def _stop_soon(self) -> None:
        self._stop()

    def _exit(self) -> None:
        self.events.append("exit")


class InPool(Pool):
    """A payload whose calls all run in the actor (as a Spark session's)."""

    LAPSE_RETIRES = False


def test_a_lease_reports_the_pools_figures_and_a_busy_pool_is_waited_for_at_most_its_start_up_time():
    pool = Pool(start_s=5.0)
    taken = pool.acquire(0.0, tag="run-a")
    assert taken is not None and taken.calls == 0 and taken.start_seconds == 5.0 and taken.figures.cpus == 2.0
    assert pool.serving() == "run-a"
    before = pool.clock()
    assert pool.acquire(DEFAULT.busy_wait_s, tag="run-b") is None  # another would take 5 s to start
    assert pool.clock() - before == pytest.approx(5.0)
    before = pool.clock()
    assert pool.acquire(2.0) is None and pool.clock() - before == pytest.approx(2.0)
    assert pool.acquire(0.0) is None and pool.serving() == "run-a"


def test_a_waiting_job_takes_the_lease_as_soon_as_the_holder_ends_its_call():
    pool = Pool()
    first = pool.acquire(0.0).lease
    pool._cond.meanwhile = lambda: pool.finish(first, ok=True)
    second = pool.acquire(DEFAULT.busy_wait_s)
    assert second is not None and second.calls == 1 and second.lease != first
    assert pool.events == []


def test_a_call_that_may_have_broken_the_payload_retires_the_pool_and_it_refuses_every_later_call():
    pool = Pool()
    lease = pool.acquire(0.0).lease
    assert pool.finish(lease, ok=False) == 1
    assert pool.events == ["stop", "exit"] and pool.retired
    with pytest.raises(PoolRetired, match="Test pool .* is stopping"):
        pool.acquire(0.0)
    assert pool.release_if_idle() is False and pool.expire() is None


def test_only_the_lease_holder_calls_beats_and_ends_its_lease():
    pool = Pool()
    lease = pool.acquire(0.0).lease
    assert pool.heartbeat("another") is False and pool.heartbeat(lease) is True
    with pytest.raises(RuntimeError, match="without its lease"), pool.holding("another"):
        pass
    pool.finish("another", ok=False)  # not the lease's: changes nothing
    assert not pool.retired and pool.serving() is None and pool.lease == lease


def test_an_unleased_pool_stops_after_its_idle_timeout_and_an_extra_replica_after_a_minute():
    pool = Pool(idle_timeout_s=600)
    pool.clock.advance(599)
    assert pool.expire() is None and pool.events == []
    pool.clock.advance(2)
    assert pool.expire() == "idle for 600s" and pool.events == ["stop", "exit"]
    extra = Pool(name=f"{KEY}-1", idle_timeout_s=600)
    extra.clock.advance(61)
    assert extra.expire() == "idle for 60s"


def test_a_leased_pool_never_idles_out_and_the_idle_time_counts_from_the_end_of_the_last_lease():
    pool = Pool(idle_timeout_s=60)
    lease = pool.acquire(0.0).lease
    for _ in range(10):
        pool.clock.advance(20)
        pool.heartbeat(lease)
        assert pool.expire() is None
    pool.finish(lease, ok=True)
    pool.clock.advance(59)
    assert pool.expire() is None
    pool.clock.advance(2)
    assert pool.expire() == "idle for 60s"


def test_a_pool_past_its_maximum_age_is_recycled_after_its_call_or_at_the_next_lease():
    """A backfill never lets a pool idle out: past its maximum age it is recycled all the same, after
    the call that holds it, or at the next lease (which then starts a fresh one under the same name)."""
    busy = Pool()
    busy.policy = PoolPolicy(max_age_s=3600)
    lease = busy.acquire(0.0).lease
    busy.clock.advance(3601)
    assert busy.heartbeat(lease) and busy.expire() is None  # never in the middle of a call
    busy.finish(lease, ok=True)
    assert busy.retired and busy.events == ["stop", "exit"]
    idle = Pool()
    idle.policy = PoolPolicy(max_age_s=3600)
    idle.clock.advance(3601)
    with pytest.raises(PoolRetired, match="stopping \\(it reached its maximum age, 3600s\\)"):
        idle.acquire(0.0)
    assert idle.events == ["stop", "exit"]


def test_a_lease_says_how_long_the_pool_sat_idle_before_it_and_how_old_it_is():
    pool = Pool(start_s=5.0)
    first = pool.acquire(0.0)
    assert first.idle_seconds == 0.0 and first.age_seconds == 5.0
    pool.clock.advance(30)
    pool.finish(first.lease, ok=True)
    pool.clock.advance(120)  # idle between two jobs: counted by the job that ends it
    second = pool.acquire(0.0)
    assert second.idle_seconds == 120.0 and second.age_seconds == 155.0


def test_a_job_says_why_it_did_not_reuse_a_pool():
    why = job_side.why_started
    assert "no test pool was running (the first job" in why("test pool", [], [], [])
    assert "1 of another configuration (other settings, runtime_env or code)" in why(
        "test pool", [], ["x-0"], []
    )
    assert (
        why("test pool", ["k-0", "k-1"], [], []) == "every test pool of this configuration was busy (2 live)"
    )
    assert why(
        "test pool", ["k-0"], [], ["Test pool k-0 is stopping (it reached its maximum age, 3600s)"]
    ) == ("Test pool k-0 is stopping (it reached its maximum age, 3600s)")


def test_a_lease_its_job_stopped_beating_retires_the_pool_so_an_abandoned_call_never_runs_on():
    pool = Pool()
    lease = pool.acquire(0.0, tag="run-a").lease
    pool.clock.advance(LEASE_TIMEOUT_S - 1)
    assert pool.heartbeat(lease) and pool.expire() is None
    pool.clock.advance(LEASE_TIMEOUT_S + 1)
    assert "stopped beating its lease 31s ago" in pool.expire()
    assert pool.retired and pool.events == ["stop", "exit"]


@pytest.mark.parametrize(
    ("runs", "kept_for"), [(True, LEASE_GRACE_S), (None, LEASE_TIMEOUT_S), (False, LEASE_TIMEOUT_S)]
)
def test_a_silent_lease_whose_job_still_runs_is_kept_for_a_grace_a_killed_jobs_is_not(runs, kept_for):
    """A driver paused past a few beats (a long GC, a stalled node) keeps its healthy group: the pool
    asks the cluster whether the holder's job still runs before it retires (issue 56)."""
    pool = Pool()
    pool.holder_runs = lambda: runs  # the GCS job table's answer for the holder
    pool.acquire(0.0, tag="run-a", holder="02000000")
    pool.clock.advance(kept_for)
    assert pool.expire() is None and not pool.retired
    pool.clock.advance(1)
    assert f"stopped beating its lease {kept_for + 1:.0f}s ago" in pool.expire() and pool.retired


def test_a_call_running_in_the_pool_holds_its_lease_and_then_a_lapsed_lease_only_frees_that_pool():
    """A Spark session runs its calls itself: a killed job's call finishes there, and the session,
    sound, serves the next job."""
    pool = InPool()
    lease = pool.acquire(0.0).lease
    with pool.holding(lease):
        pool.clock.advance(10 * LEASE_TIMEOUT_S)  # a long call; its job was killed meanwhile
        assert pool.expire() is None
    pool.clock.advance(LEASE_TIMEOUT_S + 1)
    assert pool.expire() is None and not pool.retired and pool.events == []
    assert pool.serving() is None and pool.calls == 1
    assert pool.acquire(0.0).calls == 1


def test_an_unleased_pool_gives_way_and_a_leased_one_refuses():
    pool = Pool()
    lease = pool.acquire(0.0).lease
    assert pool.release_if_idle() is False and pool.events == []
    pool.finish(lease, ok=True)
    assert pool.release_if_idle() is True and pool.events == ["stop", "exit"]
    assert pool.release_if_idle() is False  # stopping already


def test_a_new_pool_is_kept_for_the_job_that_started_it_until_its_first_lease_or_a_lease_timeout():
    """The starter's lease request waits in the actor's queue while the payload starts: a job
    giving way in between must not stop the pool under it. One that never comes loses it."""
    kept, abandoned = Pool(), Pool()
    assert kept.release_if_idle() is False and kept.events == []
    kept.finish(kept.acquire(0.0).lease, ok=True)
    assert kept.release_if_idle() is True  # served its starter: idle like any other
    abandoned.clock.advance(LEASE_TIMEOUT_S - 0.1)
    assert abandoned.release_if_idle() is False
    abandoned.clock.advance(0.2)
    assert abandoned.release_if_idle() is True and abandoned.events == ["stop", "exit"]


def test_a_pool_whose_payload_broke_while_idle_is_retired_by_its_would_be_holder():
    pool = Pool()
    pool.fault = "lost a worker while idle"
    taken = pool.acquire(0.0)
    assert taken.broken == f"Test pool {KEY}-0 lost a worker while idle"
    assert pool.events == [], "it still answers: stopping first would lose the reason"
    pool.finish(taken.lease, ok=False)
    assert pool.retired and pool.events == ["stop", "exit"]


def test_a_stop_that_fails_still_ends_the_actor():
    pool = Pool()

    def fails() -> None:
        raise RuntimeError("the JVM is gone")

    pool.stop = fails  # type: ignore[method-assign]
    pool.finish(pool.acquire(0.0).lease, ok=True)
    assert pool.release_if_idle() and pool.events == ["exit"]


# -- the job's side: warm.lease.lease ---------------------------------------------------------------
class Method:
    def __init__(self, fn) -> None:
        self.fn = fn

    def options(self, **_: object) -> Method:
        return self

    def remote(self, *args: object) -> object:
        return self.fn(*args)


class Handle:
    """A replica's actor handle whose calls run at once (``ray.get`` is the identity here)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def __getattr__(self, name: str) -> Method:
        return Method(getattr(self.pool, name))


@pytest.fixture
def replicas(monkeypatch):
    import ray

    live: dict[str, Pool] = {}
    monkeypatch.setattr(ray, "get", lambda value, **_: value)
    monkeypatch.setattr(registry, "replicas", lambda namespace, key: sorted(live))
    monkeypatch.setattr(registry, "pools", lambda namespace: sorted(live))
    monkeypatch.setattr(job_side, "_room_for", lambda cpus, key, evict: True)
    monkeypatch.setattr(
        job_side, "start", lambda payload, name, args, env, policy: Handle(live.setdefault(name, Pool(name)))
    )
    return live


def test_a_job_holds_a_free_replicas_lease_for_its_block_and_its_own_errors_leave_the_pool_sound(replicas):
    with (
        pytest.raises(ValueError, match="the job's own"),
        job_side.lease(Pool, KEY, 2.0, (), {}, tag="run-a") as got,
    ):
        assert got.name == f"{KEY}-0" and replicas[got.name].serving() == "run-a"
        raise ValueError("the job's own error")
    pool = replicas[f"{KEY}-0"]
    assert got.calls == 1 and got.grant.calls == 0 and pool.serving() is None and not pool.retired
    assert not got.reused and got.why and got.why.startswith("no test pool was running")
    with job_side.lease(Pool, KEY, 2.0, (), {}) as again:
        assert again.name == got.name and again.grant.calls == 1
    assert again.reused and again.why is None
    assert again.use().reused and again.use().name == got.name and again.use().why is None
    assert "(warm; idle 0s before it" in again.describe()


def test_a_failure_in_a_risky_part_retires_the_pool_when_the_lease_ends(replicas):
    with (
        pytest.raises(RuntimeError, match="a worker failed"),
        job_side.lease(Pool, KEY, 2.0, (), {}) as got,
    ):
        with got.at_risk():
            raise RuntimeError("a worker failed")
    assert replicas[got.name].retired and replicas[got.name].events == ["stop", "exit"]
