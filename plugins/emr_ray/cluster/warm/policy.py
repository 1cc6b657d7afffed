"""The numbers of a warm pool's lifecycle, as one typed value (why each is what it is:
``docs/warm-pools.md``). The pool gets its policy when it starts; the job's lease reads the same
value for how long it waits."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class PoolPolicy:
    """How long a pool lives idle, how long a lease survives silence, and how long a job waits."""

    #: a replica ``-0`` unleased for this long stops (the job's ``*_idle_timeout``)
    idle_timeout_s: float = 600.0
    #: the idle timeout of a configuration's extra replicas (``-1``, ``-2``...): a burst's replicas
    #: give the cluster back soon, as only jobs that ask for CPUs release idle pools
    extra_replica_idle_s: float = 60.0
    #: a lease whose job has not beaten it for this long is abandoned, unless the cluster still runs the job
    lease_timeout_s: float = 30.0
    #: the longest silence a lease survives while its job still runs (a paused driver, not a killed one)
    lease_grace_s: float = 300.0
    #: how often a job beats its lease
    beat_s: float = 1.0
    #: a pool older than this is recycled when its lease ends, or at the next lease when idle
    max_age_s: float = 12 * 3600.0
    #: the longest a job waits for a busy replica before it may start another (each replica caps the
    #: wait at its own start-up time: what starting another would cost)
    busy_wait_s: float = 120.0
    #: how long a job with no pool of its configuration waits for room before starting one anyway
    room_wait_s: float = 60.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value > 0:
                raise ValueError(f"PoolPolicy.{name}={value!r}: use a positive number of seconds.")
        if self.beat_s >= self.lease_timeout_s:
            raise ValueError(
                f"PoolPolicy.beat_s={self.beat_s} must be shorter than lease_timeout_s={self.lease_timeout_s}: "
                "a lease would lapse between two beats."
            )
        if self.lease_grace_s < self.lease_timeout_s:
            raise ValueError(
                f"PoolPolicy.lease_grace_s={self.lease_grace_s} must be at least lease_timeout_s="
                f"{self.lease_timeout_s}."
            )

    def idle_timeout(self, name: str) -> float:
        """The idle timeout of replica ``name``: the configured one for ``-0``, at most
        ``extra_replica_idle_s`` for the others."""
        if name.endswith("-0"):
            return float(self.idle_timeout_s)
        return min(float(self.idle_timeout_s), self.extra_replica_idle_s)

    def idle_after(self, seconds: float) -> PoolPolicy:
        """This policy with the job's idle timeout."""
        return replace(self, idle_timeout_s=float(seconds))


#: the policy every pool has unless its job says otherwise
DEFAULT = PoolPolicy()
