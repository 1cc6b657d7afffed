"""The token rule shared by the Spark step and the serving model (include/preprocessing/text.py).

The Spark side of the same rule is held to these tokens row by row in
``tests/integration/test_retrain_text.py`` (every review the pipeline tokenised, tricky ones included).
"""

from __future__ import annotations

import pytest

from include.preprocessing.text import UNKNOWN, token_ids, tokens, words


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Not GOOD!!!", ["not", "good"]),
        ("Don’t  hate it", ["dont", "hate", "it"]),  # curly and straight apostrophes are deleted
        ("isn't", ["isnt"]),
        ("café\tnaïve\nÉCOLE", ["caf", "na", "ve", "cole"]),  # no Unicode case or letters: separators
        ("5 stars, #1 -- 2nd\U0001f600best", ["5", "stars", "1", "2nd", "best"]),
        ("snake_case and-dashes", ["snake", "case", "and", "dashes"]),  # "_" never survives into a word
        ("\u212a elvin", ["elvin"]),  # the Kelvin sign is no "k", in Java or Python
        ("", []),
        (None, []),
        ("?!...", []),
    ],
)
def test_words_are_ascii_lowercase_runs_of_letters_and_digits(raw, expected):
    assert words(raw) == expected


def test_tokens_interleave_words_with_their_adjacent_pairs():
    assert tokens("The plot was NOT good.") == [
        "the", "the_plot", "plot", "plot_was", "was", "was_not", "not", "not_good", "good",
    ]  # fmt: skip
    assert tokens("good") == ["good"] and tokens(" ") == []


def test_ids_come_from_the_vocabulary_and_unknown_tokens_are_one():
    vocab = {"not": 2, "good": 3, "not_good": 4}
    assert token_ids("Not good, not bad", vocab) == [2, 4, 3, UNKNOWN, 2, UNKNOWN, UNKNOWN]
