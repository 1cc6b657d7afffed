"""Synthetic product and film reviews for the text-classification DAG (nothing is downloaded).

Each review is a few sentences: filler sentences drawn from a Zipf-distributed vocabulary (a few
hundred everyday words and a long tail of rare made-up ones, as real text has), and one to three
opinion phrases ("the battery was really great", "i did not enjoy the plot"). The label (1
positive, 0 negative) is the majority polarity of the opinion phrases, where a NEGATOR flips a
phrase ("not good" is negative, "never boring" positive). About 40% of the phrases are negated, so
the same polar word appears in both classes: a bag of unigrams (any linear model on word counts)
gets the negated reviews wrong, while adjacent-word pairs ("not_good") or word order get them
right. Neutral uses of "not" ("not sure", "not yet") make "not" alone no clue either.

The raw text is as untidy as users write it (capitals, curly apostrophes, "!!!", accents, emoji,
digits, line breaks), so the tokeniser has real work. A small share of labels is flipped (noise).

Deterministic per date and ``seed``. Columns: ``doc_id`` string, ``text`` string, ``label`` int64,
and ``negated`` int64 (1 when the label-deciding phrases include a negated one; for evaluation
only, not an input of the model). Runs without Airflow:
``python -m include.data.text --root cos://bucket/raw_text --start 2026-11-26 --days 3``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib

ROWS = 3000

POSITIVE = [
    "good",
    "great",
    "excellent",
    "wonderful",
    "amazing",
    "brilliant",
    "superb",
    "delightful",
    "fantastic",
    "solid",
    "pleasant",
    "impressive",
    "charming",
    "reliable",
    "fun",
]
NEGATIVE = [
    "bad",
    "terrible",
    "awful",
    "poor",
    "boring",
    "dreadful",
    "disappointing",
    "mediocre",
    "horrible",
    "weak",
    "dull",
    "annoying",
    "flimsy",
    "sloppy",
    "painful",
]
POSITIVE_VERBS = ["love", "enjoy", "like", "recommend", "adore", "appreciate"]
NEGATIVE_VERBS = ["hate", "regret", "dislike", "resent", "detest", "loathe"]
NOUNS = [
    "film",
    "plot",
    "acting",
    "battery",
    "screen",
    "service",
    "food",
    "staff",
    "price",
    "story",
    "ending",
    "camera",
    "delivery",
    "sound",
    "design",
    "hotel",
    "room",
    "book",
    "app",
    "seller",
]
INTENSIFIERS = ["really", "very", "truly", "quite", "so", "just"]
# neutral filler, most frequent first: rank r is drawn with probability ~ 1 / r**ZIPF
COMMON = """the a and to of it i was is in this that for with on my we at but they as had you be
have so all from an or there were one when out up what about would just been after which get their
time more some if only day them could then also our into back two other how first us over even week
new can now last way bought box year made well went came got again because through still around
long take same each little while here thing things since before next order arrived people kind
seemed told left home family friend weekend morning evening night part whole
something nothing everything probably maybe though although later often usually another during
""".split()
ZIPF = 1.1
RARE_WORDS = 2000  # made-up tail words ("bramoli", "tesu"): most appear once or twice a day
NEGATION_RATE = 0.4
NOISE_RATE = 0.03
_SYLLABLES = [
    "ba",
    "ro",
    "li",
    "te",
    "su",
    "mo",
    "ka",
    "ne",
    "vi",
    "do",
    "ra",
    "pe",
    "zu",
    "fa",
    "lo",
    "mi",
    "ta",
    "go",
    "ve",
    "sa",
]
# untidy spellings users type; the tokeniser (include.preprocessing.text) reduces each to plain words
_NOISE_TOKENS = [
    "!!!",
    "...",
    ":)",
    "\U0001f600",
    "café",
    "naïve",
    "5",
    "2nd",
    "#1",
    "(sic)",
    "--",
    "\t",
    "\n",
]


def vocabulary() -> list[str]:
    """The filler words, most frequent first (common English words, then the made-up tail)."""
    import numpy as np

    rng = np.random.default_rng(11)
    common = list(dict.fromkeys(COMMON))
    rare: list[str] = []
    seen = set(common)
    while len(rare) < RARE_WORDS:
        word = "".join(rng.choice(_SYLLABLES, size=int(rng.integers(2, 4))))
        if word not in seen:
            seen.add(word)
            rare.append(word)
    return common + rare


def _opinion(rng, polarity: int, negated: bool) -> list[str]:
    """One opinion phrase whose meaning has ``polarity``; ``negated`` puts a negator before a word of
    the opposite polarity ("not bad" for +1)."""
    word_polarity = -polarity if negated else polarity
    noun = NOUNS[rng.integers(len(NOUNS))]
    if rng.random() < 0.65:  # "the plot was (really) (not) good (at all)"
        adjectives = POSITIVE if word_polarity > 0 else NEGATIVE
        adjective = adjectives[rng.integers(len(adjectives))]
        verb = ["is", "was"][rng.integers(2)]
        intensifiers = ["really", "just", "simply"] if negated else INTENSIFIERS  # never "very not good"
        lead = [str(rng.choice(intensifiers))] if rng.random() < 0.3 else []
        if not negated:
            return ["the", noun, verb, *lead, adjective]
        negator = [["not"], ["never"], [verb[:-1] + "sn't"]][rng.integers(3)]
        if negator[0].endswith("n't"):
            return ["the", noun, *lead, *negator, adjective]
        tail = ["at", "all"] if rng.random() < 0.2 else []
        return ["the", noun, verb, *lead, *negator, adjective, *tail]
    verbs = POSITIVE_VERBS if word_polarity > 0 else NEGATIVE_VERBS
    verb = verbs[rng.integers(len(verbs))]
    if not negated:  # "i (really) love the food"
        return ["i", *([str(rng.choice(INTENSIFIERS))] if rng.random() < 0.3 else []), verb, "the", noun]
    negator = [["do", "not"], ["don't"], ["did", "not"], ["never"]][rng.integers(4)]
    return ["i", *negator, verb, "the", noun]  # "i don't hate the food"


def _filler(rng, words: list[str], cumulative) -> list[str]:
    picks = cumulative.searchsorted(rng.random(int(rng.integers(3, 8))), side="right")
    sentence = [words[min(int(j), len(words) - 1)] for j in picks]
    if rng.random() < 0.15:  # a neutral "not", so "not" alone tells nothing
        at = int(rng.integers(len(sentence) + 1))
        sentence[at:at] = ["not", "sure"] if rng.random() < 0.5 else ["not", "yet"]
    return sentence


def _untidy(rng, sentence: list[str]) -> str:
    """The sentence as a user might type it: capitals, curly apostrophes, stray symbols."""
    words = list(sentence)
    if rng.random() < 0.1:
        at = int(rng.integers(len(words)))
        words[at] = words[at].upper()
    if rng.random() < 0.15:
        words.insert(int(rng.integers(len(words) + 1)), _NOISE_TOKENS[rng.integers(len(_NOISE_TOKENS))])
    text = " ".join(words).replace("'", "\u2019" if rng.random() < 0.3 else "'")
    return text[:1].upper() + text[1:] + [".", ".", ".", "!", "!!", " ?"][rng.integers(6)]


def make_partition(partition: str, rows: int = ROWS, seed: int = 0):
    """One day's reviews as a pyarrow Table (see the module docstring for what they hold)."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(int(hashlib.sha256(f"{partition}/{seed}".encode()).hexdigest()[:8], 16))
    words = vocabulary()
    weights = 1.0 / np.arange(1, len(words) + 1) ** ZIPF
    cumulative = np.cumsum(weights / weights.sum())
    ids, texts, labels, negated = [], [], [], []
    for i in range(rows):
        label = int(rng.integers(2))
        polarity = 1 if label else -1
        count = int(rng.choice([1, 2, 3], p=[0.5, 0.3, 0.2]))
        # a strict majority agrees with the label; with three phrases one may disagree
        polarities = [polarity] * count
        if count == 3 and rng.random() < 0.5:
            polarities[int(rng.integers(3))] = -polarity
        flips = [bool(rng.random() < NEGATION_RATE) for _ in polarities]
        sentences = [_opinion(rng, p, f) for p, f in zip(polarities, flips, strict=True)]
        sentences += [_filler(rng, words, cumulative) for _ in range(int(rng.integers(0, 3)))]
        order = rng.permutation(len(sentences))
        texts.append(" ".join(_untidy(rng, sentences[j]) for j in order))
        ids.append(f"{partition}-{seed}-{i:06d}")
        negated.append(int(any(f for p, f in zip(polarities, flips, strict=True) if p == polarity)))
        labels.append(1 - label if rng.random() < NOISE_RATE else label)
    return pa.table(
        {
            "doc_id": pa.array(ids),
            "text": pa.array(texts),
            "label": pa.array(labels, pa.int64()),
            "negated": pa.array(negated, pa.int64()),
        }
    )


def write_partitions(
    root: str, start: str, days: int, options=None, rows: int = ROWS, seed: int = 0
) -> list[str]:
    """Write ``days`` daily partitions from ``start`` under ``root``, each committed with ``_SUCCESS``."""
    import pyarrow.parquet as pq

    from emr_ray.cluster import storage

    written = []
    fsys, base = storage.resolve(root, options)
    for offset in range(days):
        partition = (dt.date.fromisoformat(start) + dt.timedelta(days=offset)).isoformat()
        fsys.create_dir(f"{base}/dt={partition}", recursive=True)
        table = make_partition(partition, rows, seed)
        pq.write_table(table, f"{base}/dt={partition}/part-00000.parquet", filesystem=fsys)
        uri = storage.join(root, f"dt={partition}")
        storage.write_marker(uri, options)
        written.append(uri)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", required=True, help="file:///abs/raw_text or cos://bucket/raw_text")
    parser.add_argument("--start", required=True, help="first partition date, YYYY-MM-DD")
    parser.add_argument("--days", type=int, default=1)
    parser.add_argument("--rows", type=int, default=ROWS, help="reviews per partition")
    args = parser.parse_args(argv)
    for uri in write_partitions(args.root, args.start, args.days, rows=args.rows):
        print(uri)


if __name__ == "__main__":
    main()
