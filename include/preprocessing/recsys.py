"""Preprocessing for the recommender, run by Spark on Ray: index ids, hold out, sample negatives.

From one day's interaction log (``user_id``, ``item_id``, ``ts``; see :mod:`include.data.interactions`)
:func:`features` makes, with Spark SQL functions only (no Python UDF):

- ``items``: ``item_id -> item_idx``, numbered ``1..N`` by training popularity (users who touched the
  item), then ``item_id``; 0 is kept for padding and unknown items. So the index order *is* the
  popularity ranking, and the popularity baseline's rank of an item is arithmetic on indexes;
- ``users``: ``user_id -> user_idx`` (``1..M`` by ``user_id``) with the user's training ``history``
  (most recent first, at most ``max_history`` items, as raw ``history_items`` too);
- ``test``: per user with at least ``min_interactions`` distinct items, the last item by time (the
  held-out positive, ``label`` 1) with the user's history (``history`` indexes, ``seen_items`` raw ids:
  the items excluded from ranking) and the popularity baseline's exact rank of the held-out item among
  the items the user has not touched (``popularity_rank``, ``popularity_hit_at_10``);
- ``train``: every other (user, item) pair as a positive, plus ``negatives`` sampled items per
  positive (label 0) drawn by a seeded hash, never from the user's training items (the held-out
  item may be drawn: training does not know the future). Each row carries the user's history
  without the row's own item, so a positive never sees itself.

Both rankings (the model's and the baseline's) exclude the same items: the user's ``history``. A
user with more than ``max_history`` training items keeps only the most recent ones there; raise
``max_history`` (and the model's input ``length``) to make the exclusion complete for heavy users.
Repeated (user, item) interactions count once, at their first time; a held-out item that no
training row has (a new item) cannot be ranked by either side, so its test row is dropped.
"""

from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    "negatives": 4,
    "max_history": 64,
    "min_interactions": 3,
    "seed": 42,
    "positive_events": None,  # e.g. ["click", "purchase"]; None counts every event
}


def settings(config: dict[str, Any]) -> dict[str, Any]:
    """The step's settings with defaults, checked before Spark does any work."""
    merged = {**DEFAULTS, **{k: v for k, v in config.items() if k in DEFAULTS}}
    for key, low in (("negatives", 1), ("max_history", 1), ("min_interactions", 2)):
        try:
            merged[key] = int(merged[key])
        except (TypeError, ValueError):
            merged[key] = None
        if merged[key] is None or merged[key] < low:
            raise ValueError(f"recsys preprocessing: {key}={config.get(key)!r}; use an integer >= {low}.")
    merged["seed"] = int(merged["seed"])
    events = merged["positive_events"]
    if events is not None and (not isinstance(events, list) or not events):
        raise ValueError(
            f"recsys preprocessing: positive_events={events!r}; use a non-empty list like ['click'], or omit it."
        )
    return merged


def features(df, config: dict[str, Any]) -> dict[str, Any]:
    """The ``train``, ``test``, ``users`` and ``items`` DataFrames of one interaction partition."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    s = settings(config)
    for column in ("user_id", "item_id", "ts"):
        if column not in df.columns:
            raise ValueError(
                f"recsys preprocessing: the input has no {column!r} column (it has {df.columns}); "
                "the log needs user_id, item_id and ts."
            )
    log = df if s["positive_events"] is None else df.filter(F.col("event").isin(s["positive_events"]))
    # one row per (user, item): the first time the user met the item
    pairs = (
        log.where(F.col("user_id").isNotNull() & F.col("item_id").isNotNull() & F.col("ts").isNotNull())
        .groupBy("user_id", "item_id")
        .agg(F.min("ts").alias("ts"))
    )
    by_user = Window.partitionBy("user_id")
    latest_first = by_user.orderBy(F.col("ts").desc(), F.col("item_id").desc())
    pairs = pairs.withColumn("recency", F.row_number().over(latest_first)).withColumn(
        "user_items", F.count("*").over(by_user)
    )
    held_out = (F.col("recency") == 1) & (F.col("user_items") >= s["min_interactions"])
    test_pairs = pairs.where(held_out).select("user_id", "item_id")
    train_pairs = pairs.where(~held_out).select("user_id", "item_id", "ts").cache()

    # the indexes, from the training pairs only: item order = popularity order (ties by id)
    items = (
        train_pairs.groupBy("item_id")
        .agg(F.count("*").alias("popularity"))
        .withColumn("item_idx", F.row_number().over(Window.orderBy(F.col("popularity").desc(), "item_id")))
        .cache()
    )
    num_items = items.count()
    indexed = train_pairs.join(items.select("item_id", "item_idx"), "item_id")
    recent = F.sort_array(F.collect_list(F.struct("ts", "item_idx", "item_id")), asc=False)
    histories = indexed.groupBy("user_id").agg(F.slice(recent, 1, s["max_history"]).alias("recent"))
    users = (
        histories.withColumn("user_idx", F.row_number().over(Window.orderBy("user_id")))
        .select(
            "user_id",
            "user_idx",
            F.col("recent.item_idx").alias("history"),
            F.col("recent.item_id").alias("history_items"),
        )
        .cache()
    )

    user_rows = users.select("user_id", "user_idx", "history")
    with_history = indexed.join(user_rows, "user_id").select("user_idx", "item_idx", "history").cache()
    positives = with_history.withColumn("history", F.filter("history", lambda x: x != F.col("item_idx")))
    user_items = with_history.select("user_idx", "item_idx")
    negatives = _negatives(with_history, user_items, s["negatives"], num_items, s["seed"])
    train = positives.withColumn("label", F.lit(1).cast("long")).unionByName(
        negatives.withColumn("label", F.lit(0).cast("long"))
    )
    # the loop reads the metric columns from every dataset; a training row scores no baseline
    train = train.withColumn("popularity_hit_at_10", F.lit(0.0))

    rank = F.col("item_idx") - F.size(F.filter("history", lambda x: x < F.col("item_idx")))
    test = (
        test_pairs.join(users, "user_id")
        .join(items.select("item_id", "item_idx"), "item_id")  # inner: a new item cannot be ranked
        .select(
            "user_id",
            "item_id",
            "user_idx",
            "item_idx",
            "history",
            F.col("history_items").alias("seen_items"),
            F.lit(1).cast("long").alias("label"),
            rank.cast("long").alias("popularity_rank"),
        )
        .withColumn("popularity_hit_at_10", (F.col("popularity_rank") <= 10).cast("double"))
    )
    return {
        "train": train,
        "test": test,
        "users": users,
        "items": items.select("item_id", "item_idx", "popularity"),
    }


def _negatives(positives, user_items, k: int, num_items: int, seed: int):
    """``k`` items per positive that the user has no training interaction with, by a seeded hash.

    Draws ``2k`` candidates from ``xxhash64(seed, user, item, draw)`` (the same draws whatever Spark's
    partitioning), drops the user's own training items (all of them, not only the ``history``),
    keeps the first ``k``: fewer only when most of the draws hit the user's items.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    draws = positives.select(
        "user_idx",
        F.col("item_idx").alias("positive"),
        "history",
        F.explode(F.sequence(F.lit(1), F.lit(2 * k))).alias("draw"),
    )
    candidate = F.pmod(F.xxhash64(F.lit(seed), "user_idx", "positive", "draw"), F.lit(num_items)) + 1
    draws = draws.withColumn("item_idx", candidate.cast("int"))
    fresh = draws.join(user_items, ["user_idx", "item_idx"], "left_anti")
    first = Window.partitionBy("user_idx", "positive").orderBy("draw")
    return (
        fresh.withColumn("n", F.row_number().over(first))
        .where(F.col("n") <= k)
        .select("user_idx", "item_idx", "history")
    )
