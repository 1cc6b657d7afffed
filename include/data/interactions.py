"""Synthetic interaction logs for the recommender DAG: who viewed, clicked or bought which item, when.

Nothing can be downloaded, so the logs come from a small hidden world with the two structures a
recommender must tell apart:

- **personal taste**: every user and item has a latent factor vector (``dim`` of them); a user
  prefers items whose vector points the same way as theirs;
- **popularity**: items also have a Zipf-like popularity (``log`` weight ``-skew * log(rank)``), the
  same for everyone, so recommending the most popular items is a real baseline, but a beatable one.

Each user picks ``min_per_user..max_per_user`` distinct items a day, drawn without replacement with
probability ``softmax(taste * <user, item> + popularity)`` (Gumbel top-k), at random times of the
day, so the user's last interaction is a fair draw from the same preferences. The world (factors,
popularity) depends on ``world_seed`` only, so every day's partition has the same users and items; the
day's draws are seeded by the date, so a rerun writes the same bytes.

Rows: ``user_id`` (string ``u0001``), ``item_id`` (string ``i0001``), ``ts`` (timestamp, UTC, within
the partition's day), ``event`` (``view``, ``click`` or ``purchase``). One Parquet file per day under
``<root>/dt=<date>/part-00000.parquet`` with the ``_SUCCESS`` marker, like any producer's partition.
Runs without Airflow: ``python -m include.data.interactions --root file:///tmp/raw --start 2026-11-26``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
from dataclasses import asdict, dataclass
from typing import Any

SCHEMA = {"user_id": "string", "item_id": "string", "ts": "timestamp[us, tz=UTC]", "event": "string"}
EVENTS = ("view", "click", "purchase")
EVENT_WEIGHTS = (0.7, 0.25, 0.05)


@dataclass(frozen=True)
class WorldOptions:
    """The size and shape of the synthetic world (the defaults are small enough for tests)."""

    users: int = 400
    items: int = 300
    dim: int = 4
    min_per_user: int = 20
    max_per_user: int = 40
    taste: float = 6.0  # weight of personal taste against popularity
    skew: float = 1.0  # Zipf exponent of item popularity
    world_seed: int = 7

    def __post_init__(self) -> None:
        if self.users < 1 or self.items < 2 or self.dim < 1:
            raise ValueError(
                f"WorldOptions needs users >= 1, items >= 2 and dim >= 1; got users={self.users}, "
                f"items={self.items}, dim={self.dim}."
            )
        if not 1 <= self.min_per_user <= self.max_per_user <= self.items:
            raise ValueError(
                f"WorldOptions needs 1 <= min_per_user <= max_per_user <= items; got {self.min_per_user}, "
                f"{self.max_per_user}, {self.items}. Lower max_per_user or add items."
            )


def user_ids(count: int) -> list[str]:
    return [f"u{i:04d}" for i in range(1, count + 1)]


def item_ids(count: int) -> list[str]:
    return [f"i{i:04d}" for i in range(1, count + 1)]


def world(options: WorldOptions | None = None) -> dict[str, Any]:
    """The hidden world: user and item factors, item log-popularity (numpy arrays, item order = ids)."""
    import numpy as np

    o = options or WorldOptions()
    rng = np.random.default_rng(o.world_seed)
    users = rng.normal(size=(o.users, o.dim)) / np.sqrt(o.dim)
    items = rng.normal(size=(o.items, o.dim)) / np.sqrt(o.dim)
    # popularity rank is a random permutation, so it is not tied to the item id order
    rank = rng.permutation(o.items) + 1
    return {"users": users, "items": items, "popularity": -o.skew * np.log(rank)}


def preferences(options: WorldOptions | None = None):
    """Every user's log-preference for every item, ``[users, items]`` (what the draws follow)."""
    o = options or WorldOptions()
    w = world(o)
    return o.taste * w["users"] @ w["items"].T + w["popularity"][None, :]


def make_partition(partition: str, options: WorldOptions | None = None):
    """One day's interaction log as a pyarrow Table, sorted by time."""
    import numpy as np
    import pyarrow as pa

    o = options or WorldOptions()
    day = dt.date.fromisoformat(partition)
    seed = int(hashlib.sha256(f"interactions/{partition}".encode()).hexdigest()[:8], 16)
    rng = np.random.default_rng(seed)
    logits = preferences(o)
    counts = rng.integers(o.min_per_user, o.max_per_user + 1, size=o.users)
    # Gumbel top-k: the k largest perturbed logits are a draw of k items without replacement
    perturbed = logits + rng.gumbel(size=logits.shape)
    order = np.argsort(-perturbed, axis=1)
    users = np.repeat(np.arange(o.users), counts)
    items = np.concatenate([order[u, : counts[u]] for u in range(o.users)])
    start = int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp() * 1_000_000)
    ts = start + rng.integers(0, 86_400 * 1_000_000, size=len(users))
    events = rng.choice(len(EVENTS), size=len(users), p=EVENT_WEIGHTS)
    by_time = np.argsort(ts, kind="stable")
    uid, iid = np.array(user_ids(o.users)), np.array(item_ids(o.items))
    return pa.table(
        {
            "user_id": pa.array(uid[users[by_time]], pa.string()),
            "item_id": pa.array(iid[items[by_time]], pa.string()),
            "ts": pa.array(ts[by_time], pa.timestamp("us", tz="UTC")),
            "event": pa.array(np.array(EVENTS)[events[by_time]], pa.string()),
        }
    )


def write_partitions(
    root: str, start: str, days: int, options=None, world_options: WorldOptions | None = None
) -> list[str]:
    """Write ``days`` daily partitions from ``start`` under ``root``, each committed with ``_SUCCESS``.

    :param root: e.g. ``cos://bucket/raw_interactions`` or ``file:///abs/raw_interactions``.
    :param options: storage options (credentials for ``cos://``), as for :mod:`include.data.digits`.
    :param world_options: the world's size; the defaults suit tests and the demo.
    """
    import pyarrow.parquet as pq

    from emr_ray.cluster import storage

    written = []
    first = dt.date.fromisoformat(start)
    fsys, base = storage.resolve(root, options)
    for offset in range(days):
        partition = (first + dt.timedelta(days=offset)).isoformat()
        fsys.create_dir(f"{base}/dt={partition}", recursive=True)
        table = make_partition(partition, world_options)
        pq.write_table(table, f"{base}/dt={partition}/part-00000.parquet", filesystem=fsys)
        uri = storage.join(root, f"dt={partition}")
        storage.write_marker(uri, options)
        written.append(uri)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--root", required=True, help="file:///abs/raw_interactions or cos://bucket/raw_interactions"
    )
    parser.add_argument("--start", required=True, help="first partition, YYYY-MM-DD")
    parser.add_argument("--days", type=int, default=1)
    for field, value in asdict(WorldOptions()).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value)
    args = vars(parser.parse_args(argv))
    world_options = WorldOptions(**{k: args[k] for k in asdict(WorldOptions())})
    for uri in write_partitions(args["root"], args["start"], args["days"], world_options=world_options):
        print(uri)


if __name__ == "__main__":
    main()
