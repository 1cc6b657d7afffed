"""The warm pools live on the cluster, as Ray's named actors: list a kind's pools or one
configuration's replicas, wait until a stopping one's name is free, and release idle pools for a
job that needs their CPUs (each pool's ``release_if_idle`` refuses while a job holds its lease)."""

from __future__ import annotations

import logging
import time

from emr_ray.cluster.warm.keys import POOLS, replica_index

log = logging.getLogger("emr_ray.cluster.warm")


def exists(name: str, namespace: str) -> bool:
    import ray

    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return True


def wait_gone(name: str, namespace: str, timeout: float = 30.0) -> None:
    """Wait until a stopping pool's name is free, so the next call starts a fresh one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and exists(name, namespace):
        time.sleep(0.5)


def pools(namespace: str) -> list[str]:
    """The names of the live pools of one kind."""
    import ray

    prefix = POOLS[namespace]
    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == namespace and str(a.get("name", "")).startswith(prefix)
    )


def replicas(namespace: str, key: str) -> list[str]:
    """The live replicas of one configuration, by index."""
    found = {name: replica_index(name, key) for name in pools(namespace)}
    return sorted((name for name, i in found.items() if i is not None), key=lambda name: found[name] or 0)


def release_idle(cpus_needed: float, *, keep: str | None = None) -> list[str]:
    """Release idle warm pools (of any kind) until ``cpus_needed`` CPUs are free on the cluster, or
    none is left to release. Returns the names released. ``keep``: a configuration key (or a name)
    whose pools are not released (the caller's own)."""
    import ray

    released: list[str] = []
    if ray.available_resources().get("CPU", 0.0) >= cpus_needed:
        return released
    for namespace in POOLS:
        for name in pools(namespace):
            if keep and name.startswith(keep):
                continue
            try:
                handle = ray.get_actor(name, namespace=namespace)
                if ray.get(handle.release_if_idle.options(concurrency_group="control").remote(), timeout=30):
                    released.append(name)
            except Exception as e:  # gone meanwhile, or busy and slow: not ours to force
                log.info("Warm pool %s not released: %s", name, e)
                continue
            wait_gone(name, namespace)
            if ray.available_resources().get("CPU", 0.0) >= cpus_needed:
                break
        else:
            continue
        break
    if released:
        log.info(
            "Released %d idle warm pool(s) to free %.1f CPU(s): %s",
            len(released),
            cpus_needed,
            ", ".join(released),
        )
    return released
