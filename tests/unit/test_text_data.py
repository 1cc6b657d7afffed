"""The review generator (include/data/text.py): real structure a classifier must learn, by seed.

What it promises the text DAG: deterministic partitions, balanced labels, a Zipf-shaped filler
vocabulary, and negation that flips sentiment, so a bag of unigrams fails the negated reviews while
adjacent word pairs (the Spark step's tokens) get them right.
"""

from __future__ import annotations

from collections import Counter

import pyarrow.parquet as pq
import pytest

from emr_ray.cluster import storage
from include.data import text
from include.preprocessing.text import tokens, words


@pytest.fixture(scope="module")
def day():
    return text.make_partition("2026-11-02", 2000).to_pandas()


def test_a_partition_is_deterministic_by_date_and_seed():
    assert text.make_partition("2026-11-02", 50).equals(text.make_partition("2026-11-02", 50))
    assert text.make_partition("2026-11-02", 50)["text"] != text.make_partition("2026-11-03", 50)["text"]
    assert (
        text.make_partition("2026-11-02", 50, seed=1)["text"] != text.make_partition("2026-11-02", 50)["text"]
    )


def test_rows_have_unique_ids_raw_text_and_balanced_labels(day):
    assert list(day.columns) == ["doc_id", "text", "label", "negated"]
    assert day.doc_id.is_unique
    assert set(day.label) == {0, 1} and 0.45 < day.label.mean() < 0.55
    assert 0.4 < day.negated.mean() < 0.65  # about half the reviews hinge on a negated phrase
    assert day.text.map(lambda t: len(words(t))).between(3, 45).all()


def test_the_text_is_untidy_as_users_write_it(day):
    joined = "".join(day.text)
    for mark in ("\u2019", "!!", "café", "\U0001f600", "\t"):
        assert mark in joined, mark
    assert any(w.isupper() and len(w) > 2 for t in day.text for w in t.split())


def test_filler_words_follow_a_zipf_law(day):
    lexicon = set(text.POSITIVE + text.NEGATIVE + text.POSITIVE_VERBS + text.NEGATIVE_VERBS + text.NOUNS)
    counts = Counter(w for t in day.text for w in words(t) if w not in lexicon)
    ranked = [n for _, n in counts.most_common()]
    assert ranked[0] > 10 * ranked[50] > 0  # a few words are everywhere
    assert sum(1 for n in ranked if n == 1) > 200  # and a long tail is seen once


def test_negation_flips_the_sentiment_so_unigrams_fail_where_word_pairs_succeed():
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    train = text.make_partition("2026-11-02", 2000).to_pandas()
    test = text.make_partition("2026-11-03", 600).to_pandas()
    negated = test.negated == 1
    accuracy = {}
    for name, analyzer in {"unigrams": words, "pairs": tokens}.items():
        vectorizer = CountVectorizer(analyzer=analyzer, binary=True)
        model = LogisticRegression(solver="liblinear").fit(vectorizer.fit_transform(train.text), train.label)
        right = model.predict(vectorizer.transform(test.text)) == test.label
        accuracy[name] = (right[negated].mean(), right[~negated].mean())
    assert accuracy["unigrams"][0] < 0.5 < accuracy["unigrams"][1]  # "not good" read as good
    assert min(accuracy["pairs"]) > 0.85, accuracy


def test_partitions_are_written_with_the_success_marker(tmp_path):
    root = (tmp_path / "raw_text").as_uri()
    written = text.write_partitions(root, "2026-11-30", 2, rows=20)
    assert written == [f"{root}/dt=2026-11-30", f"{root}/dt=2026-12-01"]
    for uri in written:
        assert storage.is_committed(uri)
    table = pq.read_table(tmp_path / "raw_text" / "dt=2026-12-01" / "part-00000.parquet")
    assert table.num_rows == 20 and table.equals(text.make_partition("2026-12-01", 20))
