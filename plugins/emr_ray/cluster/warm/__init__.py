"""Warm pools (cluster side): detached Ray actors that keep a Spark session or a training worker
group between jobs. Their one lifecycle is described once, in ``docs/warm-pools.md``; here it is
split by side:

- :mod:`.policy`: the lifecycle's numbers, one typed value (:class:`~.policy.PoolPolicy`);
- :mod:`.keys`: what names a pool (its configuration, code and tenant) and its replicas;
- :mod:`.actor`: the pool's side, :class:`~.actor.WarmActor` (lease, idle timeout, retire, give way);
- :mod:`.call_log`: a call's log lines, carried from the pool back to the job that prints them;
- :mod:`.lease`: the job's side, :func:`~.lease.lease` (a free, waited-for or new replica; beaten,
  then ended) and :class:`~.lease.PoolCall` (what a call brought back);
- :mod:`.registry`: the pools live on the cluster: list them, wait until one is gone, release idle ones.

A payload (``jobs/spark_session.py``, ``jobs/train_group.py``) subclasses :class:`~.actor.WarmActor`
with its own start, calls and stop. Nothing here imports the jobs.
"""
