"""The Spark step of the text DAG (include/preprocessing/text.py:tokenize) on a local Spark session:
the same ids as the serving tokeniser on tricky text, the vocabulary from the train split only, and
bad input named with its fix. (Spark on Ray runs the same function in tests/integration/test_retrain_text.py.)
"""

from __future__ import annotations

import pytest

from include.preprocessing.text import UNKNOWN, token_ids, tokenize

TRICKY = ["Don’t HATE it!!", "isn't\tbad\nat ALL", "CAFÉ naïve ÉCOLE", "\u212aelvin \U0001f600 5 stars #1",
          "snake_case and-dashes", "?!...", "", None, "NOT good, not bad", "not good"]  # fmt: skip


def reviews(spark, texts, ids=None):
    ids = ids or [f"d{i}" for i in range(len(texts))]
    rows = [(doc_id, raw, i % 2) for i, (doc_id, raw) in enumerate(zip(ids, texts, strict=True))]
    return spark.createDataFrame(rows, "doc_id string, text string, label int")


@pytest.fixture(scope="module")
def outputs(spark):
    # everything in train (test_fraction 0), so every tricky token reaches the vocabulary
    out = tokenize(reviews(spark, TRICKY), {"test_fraction": 0.0, "vocab_size": 100})
    return {name: df.toPandas() for name, df in out.items()}


def test_spark_gives_the_serving_tokeniser_s_ids_on_tricky_text(outputs):
    vocab = dict(zip(outputs["vocab"].token, outputs["vocab"].id, strict=True))
    train = outputs["train"].set_index("doc_id").loc[[f"d{i}" for i in range(len(TRICKY))]]
    assert [list(ids) for ids in train.tokens] == [token_ids(raw, vocab) for raw in TRICKY]
    assert list(train.tokens.iloc[5]) == list(train.tokens.iloc[7]) == []  # punctuation only, and null text
    assert train.text.iloc[0] == TRICKY[0] and outputs["train"].label.dtype == "int64"  # the raw text stays


def test_the_vocabulary_is_most_frequent_first_ties_by_token_ids_from_two(outputs):
    vocab = outputs["vocab"].sort_values("id")
    assert vocab.id.tolist() == list(range(2, len(vocab) + 2))
    assert vocab.token.iloc[:4].tolist() == ["not", "bad", "good", "not_good"]  # 3 times, then 2 each
    ranked = list(vocab[["count", "token"]].itertuples(index=False, name=None))
    assert ranked == sorted(ranked, key=lambda c: (-c[0], c[1]))


def test_only_training_rows_make_the_vocabulary_and_the_split_follows_the_id(spark):
    df = reviews(spark, [f"word{i} shared" for i in range(200)])
    config = {"test_fraction": 0.3, "vocab_size": 1000, "seed": 7}
    out = tokenize(df, config)
    test, vocab = out["test"].collect(), {r.token for r in out["vocab"].collect()}
    test_ids = {r.doc_id for r in test}
    assert 30 < len(test_ids) < 90
    assert test_ids == {
        r.doc_id for r in tokenize(df.repartition(3), config)["test"].select("doc_id").collect()
    }
    assert "shared" in vocab and not vocab & {f"word{int(d[1:])}" for d in test_ids}
    assert all(r.tokens[0] == UNKNOWN for r in test)  # a test review's own word is unknown


def test_the_vocabulary_keeps_the_top_tokens_seen_min_count_times(spark):
    out = tokenize(
        reviews(spark, ["a a a b b c", "a b"]), {"test_fraction": 0.0, "vocab_size": 2, "min_count": 1}
    )
    assert [(r.token, r.id) for r in out["vocab"].orderBy("id").collect()] == [("a", 2), ("b", 3)]
    out = tokenize(reviews(spark, ["a a a b b c", "a b"]), {"test_fraction": 0.0, "min_count": 3})
    assert {r.token for r in out["vocab"].collect()} == {"a", "b"}


def test_bad_input_is_named_with_its_fix(spark):
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['body'\].*set the step's text_column"):
        tokenize(reviews(spark, ["x"]), {"text_column": "body"})
    with pytest.raises(ValueError, match=r"'doc_id' must be unique per row, but \['d'\] repeat; deduplicate"):
        tokenize(reviews(spark, ["x", "y"], ids=["d", "d"]), {})
