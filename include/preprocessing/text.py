"""Preprocessing for the text classifier, run by Spark on Ray: tokenise, split, build the vocabulary,
map tokens to ids.

THE TOKEN RULE (one rule, two implementations in this module: :func:`tokens` in Python for serving,
:func:`spark_tokens` as Spark SQL expressions for training data; tests/integration/test_text_spark.py and
tests/integration/test_retrain_text.py hold their ids equal on tricky text and on every review):

1. ASCII ``A``-``Z`` become ``a``-``z``; no other character changes case (so Java's and Python's
   Unicode case tables never matter);
2. apostrophes ``'`` and ``’`` are deleted ("Don’t" -> "dont");
3. the text is split on every run of characters other than ``a``-``z`` and ``0``-``9``; empty
   pieces are dropped (accents, emoji, punctuation, tabs and line breaks all separate words);
4. the tokens are the words interleaved with each adjacent pair joined by ``_``:
   ``w1, w1_w2, w2, w2_w3, ..., wn``, so "not good" gives ``not, not_good, good``: a pooled
   bag of these tokens tells "not good" from "good" (a bag of unigrams cannot).

The vocabulary is built from the TRAIN split only: the ``vocab_size`` most frequent tokens with at
least ``min_count`` occurrences, most frequent first, ties by token; ids start at 2 (0 pads, 1 is
every token outside the vocabulary). Rows are split train/test by a hash of their id (and the
seed), so a document lands in the same split whatever the partitioning. The outputs keep every raw
column (the raw ``text`` included: a later model with another vocabulary re-tokenises it) and add
``tokens`` (list<int64>, unpadded; the training loop pads and truncates).
"""

from __future__ import annotations

import re
from typing import Any

PAD, UNKNOWN, FIRST_ID = 0, 1, 2
_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LOWER = "abcdefghijklmnopqrstuvwxyz"
APOSTROPHES = "'\u2019"
# the same pattern for Python's re and Java's regex (no \w or \d: those are Unicode-aware in Python)
SEPARATOR = "[^a-z0-9]+"
_TABLE = {**str.maketrans(_UPPER, _LOWER), **{ord(a): None for a in APOSTROPHES}}


def words(text: str | None) -> list[str]:
    """Steps 1-3 of the token rule: the words of ``text`` (None gives none)."""
    return [w for w in re.split(SEPARATOR, (text or "").translate(_TABLE)) if w]


def tokens(text: str | None) -> list[str]:
    """The token rule in Python: words interleaved with their adjacent pairs."""
    ws = words(text)
    out: list[str] = []
    for i, w in enumerate(ws):
        out.append(w)
        if i + 1 < len(ws):
            out.append(f"{w}_{ws[i + 1]}")
    return out


def token_ids(text: str | None, vocab: dict[str, int]) -> list[int]:
    """The ids of ``text``'s tokens in ``vocab`` (unknown tokens are 1), as the Spark step maps them."""
    return [vocab.get(t, UNKNOWN) for t in tokens(text)]


def spark_tokens(text):
    """The token rule as Spark SQL expressions over the string column ``text`` (no Python UDF)."""
    from pyspark.sql import functions as F

    cleaned = F.translate(F.translate(F.coalesce(text, F.lit("")), _UPPER, _LOWER), APOSTROPHES, "")
    ws = F.filter(F.split(cleaned, SEPARATOR), lambda w: w != "")
    pairs = F.transform(
        ws,
        lambda w, i: F.when(i + 1 < F.size(ws), F.array(w, F.concat(w, F.lit("_"), ws[i + 1]))).otherwise(
            F.array(w)
        ),
    )
    return F.flatten(pairs)


def _check(df, config: dict[str, Any]) -> tuple[str, str, str]:
    text, key = config.get("text_column", "text"), config.get("id_column", "doc_id")
    label = config.get("label_column", "label")
    missing = [c for c in (text, key, label) if c not in df.columns]
    if missing:
        raise ValueError(
            f"tokenize: the input lacks column(s) {missing} (it has {df.columns}); set the step's "
            "text_column / id_column / label_column to the columns holding the raw text, a unique "
            "document id and the class index."
        )
    duplicated = [r[key] for r in df.groupBy(key).count().filter("count > 1").limit(5).collect()]
    if duplicated:
        raise ValueError(
            f"tokenize: {key!r} must be unique per row, but {duplicated} repeat; deduplicate the "
            "producer's partition or set id_column to a unique column."
        )
    return text, key, label


def tokenize(df, config: dict[str, Any]) -> dict[str, Any]:
    """Tokenise ``text``, split train/test, build the vocabulary on train, map tokens to ids.

    Config: ``text_column`` ("text"), ``id_column`` ("doc_id", unique), ``label_column`` ("label",
    cast to int64), ``vocab_size`` (20000), ``min_count`` (1), ``test_fraction`` (0.2), ``seed`` (42).
    Returns ``{"train", "test", "vocab"}``; vocab has ``token``, ``id`` and its train ``count``.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    text, key, label = _check(df, config)
    size, min_count = int(config.get("vocab_size", 20000)), int(config.get("min_count", 1))
    if size < 1 or min_count < 1:
        raise ValueError(f"tokenize: vocab_size ({size}) and min_count ({min_count}) must be >= 1.")
    fraction, seed = float(config.get("test_fraction", 0.2)), int(config.get("seed", 42))
    columns = [F.col(c).cast("long").alias(c) if c == label else F.col(c) for c in df.columns]
    bucket = F.pmod(F.xxhash64(F.col(key).cast("string"), F.lit(seed)), F.lit(10000)) / 10000.0
    rows = df.select(*columns, spark_tokens(F.col(text)).alias("_words"), (bucket < fraction).alias("_test"))
    rows = rows.cache()

    train_tokens = rows.filter(~F.col("_test")).select(F.explode("_words").alias("token"))
    counts = train_tokens.groupBy("token").count().filter(F.col("count") >= min_count)
    rank = F.row_number().over(Window.orderBy(F.desc("count"), F.asc("token")))
    vocab = (
        counts.withColumn("id", (rank + (FIRST_ID - 1)).cast("long"))
        .filter(F.col("id") < size + FIRST_ID)
        .select("token", "id", "count")
        .cache()
    )

    # one shuffle: each (doc, position, token) row gets its id, then the doc's ids are gathered in order
    others = [c for c in [*df.columns, "_test"] if c != key]
    exploded = rows.select(key, *others, F.posexplode_outer("_words").alias("pos", "token"))
    with_ids = exploded.join(F.broadcast(vocab.select("token", "id")), "token", "left")
    pair = F.when(
        F.col("pos").isNotNull(),
        F.struct("pos", F.coalesce(F.col("id"), F.lit(UNKNOWN).cast("long")).alias("id")),
    )
    mapped = (
        with_ids.groupBy(key)
        .agg(*[F.first(c).alias(c) for c in others], F.sort_array(F.collect_list(pair)).alias("_pairs"))
        .select(*df.columns, F.transform("_pairs", lambda p: p["id"]).alias("tokens"), "_test")
        .cache()  # train and test are two filters of one mapping: compute it once
    )
    return {
        "train": mapped.filter(~F.col("_test")).drop("_test"),
        "test": mapped.filter(F.col("_test")).drop("_test"),
        "vocab": vocab,
    }
