"""The two-tower recommender: its scores, its ranking metric, and the served model that carries its own
id indexes, so a champion trained on another day (another index) is scored like for like."""

from __future__ import annotations

import math
import pickle

import pyarrow as pa
import pytest
import torch

from include.models import recsys

USERS = ["u1", "u2", "u3"]
ITEMS = ["a", "b", "c", "d", "e"]  # item_idx 1..5, in this order
INPUTS = [
    {"name": "user", "column": "user_idx", "dtype": "int64"},
    {"name": "item", "column": "item_idx", "dtype": "int64"},
    {"name": "history", "column": "history", "dtype": "int64", "length": 4, "pad": 0},
]
CONFIG = {"inputs": INPUTS, "label_column": "label", "metric_columns": ["popularity_hit_at_10"],
          "num_users": 3, "num_items": 5, "embedding_dim": 4}  # fmt: skip
HISTORIES = {"u1": ["a", "b"], "u2": ["c"], "u3": []}


@pytest.fixture
def model():
    torch.manual_seed(0)
    return recsys.build_model(CONFIG).eval()


def test_the_model_scores_a_pair_as_two_class_logits_matching_its_all_item_scores(model):
    user, item = torch.tensor([1, 2]), torch.tensor([3, 5])
    history = torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0]])
    logits = model(user, item, history)
    assert logits.shape == (2, 2) and torch.equal(logits[:, 0], torch.zeros(2))
    every = model.score_all(user, history)
    assert every.shape == (2, 6)  # column 0 is padding
    assert torch.allclose(logits[:, 1], every[torch.arange(2), item])


def test_a_config_without_index_sizes_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="needs num_users and num_items"):
        recsys.build_model({"num_users": "{{ missing }}"})


def test_rank_counts_only_unseen_higher_scoring_items():
    scores = torch.tensor([[9.0, 5.0, 4.0, 3.0, 2.0, 1.0]])  # column 0 (padding) never competes
    assert recsys.ranks(scores, torch.tensor([4]), torch.tensor([[0, 0]])).item() == 4
    # items 1 and 2 are in the history: they are not candidates, item 4 moves up to rank 2
    assert recsys.ranks(scores, torch.tensor([4]), torch.tensor([[1, 2]])).item() == 2
    assert recsys.ranks(scores, torch.tensor([0]), torch.tensor([[1, 2]])).item() == math.inf  # unknown item


def test_recall_at_10_counts_held_out_items_in_the_top_10():
    config = CONFIG | {"num_items": 30}
    torch.manual_seed(0)
    model = recsys.build_model(config).eval()
    history = torch.zeros((30, 4), dtype=torch.long)
    users, items = torch.ones(30, dtype=torch.long), torch.arange(1, 31)
    labels = torch.ones(30, dtype=torch.long)
    hits = recsys.METRICS["recall_at_10"](model, (users, items, history), labels, None, {})
    assert hits == 10  # of the 30 items, exactly the user's top 10 are hits
    extras = {"popularity_hit_at_10": torch.tensor([1.0, 0.0, 1.0])}
    assert recsys.METRICS["popularity_recall_at_10"](model, (), None, None, extras) == 2


def _datasets(test_rows):
    tables = {
        "users": pa.table(
            {
                "user_id": USERS,
                "user_idx": [1, 2, 3],
                "history": [[1, 2], [3], []],
                "history_items": [HISTORIES[u] for u in USERS],
            }
        ),  # fmt: skip
        "items": pa.table({"item_id": ITEMS, "item_idx": [1, 2, 3, 4, 5], "popularity": [5, 4, 3, 2, 1]}),
        "test": test_rows,
    }
    return tables.__getitem__


def _test_rows():
    index = {item: i for i, item in enumerate(ITEMS, start=1)}
    held_out = {"u1": "c", "u2": "a", "u3": "e"}
    return pa.table({
        "user_id": USERS, "item_id": [held_out[u] for u in USERS], "user_idx": [1, 2, 3],
        "item_idx": [index[held_out[u]] for u in USERS],
        "history": [[index[i] for i in HISTORIES[u]] for u in USERS],
        "seen_items": [HISTORIES[u] for u in USERS], "label": [1, 1, 1],
        "popularity_hit_at_10": [1.0, 1.0, 0.0],
    })  # fmt: skip


def test_the_served_model_scores_raw_ids_as_the_trained_model_scores_indexes(model):
    served, example = recsys.serving_model(model, CONFIG, _datasets(_test_rows()))
    assert list(example.columns) == ["user_id", "item_id"] and len(example) == 3
    served = pickle.loads(pickle.dumps(served))  # as MLflow stores it: no torch module inside
    import pandas as pd

    pairs = pd.DataFrame({"user_id": ["u1", "u2", "stranger"], "item_id": ["c", "unknown", "e"]})
    scores = served.predict(None, pairs)
    history = torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0]])
    expected = model(torch.tensor([1, 2]), torch.tensor([3, 1]), history)[:, 1]
    assert scores[0] == pytest.approx(expected[0].item(), abs=1e-6)
    assert math.isnan(scores[1])  # an item the model never saw has no score
    unknown_user = model(torch.tensor([0]), torch.tensor([5]), torch.zeros((1, 4), dtype=torch.long))[0, 1]
    assert scores[2] == pytest.approx(unknown_user.item(), abs=1e-6)  # popularity and nothing personal
    top = served.recommend(["u1"], k=3)[0]
    assert len(top) == 3 and not {"a", "b"} & set(top)  # never what the user already has


def test_evaluate_scores_a_served_model_like_the_torch_model_it_wraps(model):
    table = _test_rows()
    served, _ = recsys.serving_model(model, CONFIG, _datasets(table))
    by_index = recsys.evaluate(model, CONFIG, table)
    by_raw_ids = recsys.evaluate(served, CONFIG | {"batch_size": 2}, table)  # two batches, summed
    assert set(by_index) >= {"recall_at_10", "ndcg_at_10", "popularity_recall_at_10", "test_loss"}
    for name, value in by_index.items():
        assert by_raw_ids[name] == pytest.approx(value, abs=1e-6), name
    assert by_raw_ids["popularity_recall_at_10"] == pytest.approx(2 / 3)


def test_a_champion_with_another_item_index_is_scored_through_its_own_index(model):
    """Another generation numbers the items otherwise; moved weights must give the same figures."""
    table = _test_rows()
    served, _ = recsys.serving_model(model, CONFIG, _datasets(table))
    order = [3, 5, 1, 4, 2]  # the other generation's item 1 is our item 3, ...
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for name in ("history.weight", "item.weight", "bias.weight"):
        state[name][1:] = state[name][order]
    other = recsys.build_model(CONFIG)
    other.load_state_dict(state)
    items = pa.table({"item_id": [ITEMS[i - 1] for i in order], "item_idx": [1, 2, 3, 4, 5],
                      "popularity": [1] * 5})  # fmt: skip
    reader = _datasets(table)
    champion, _ = recsys.serving_model(other.eval(), CONFIG, lambda n: items if n == "items" else reader(n))
    assert champion.item_index != served.item_index
    mine, theirs = recsys.evaluate(served, CONFIG, table), recsys.evaluate(champion, CONFIG, table)
    for name, value in mine.items():
        assert theirs[name] == pytest.approx(value, abs=1e-5), name


def test_an_index_that_does_not_match_the_config_is_refused(model):
    with pytest.raises(ValueError, match="num_items = its row count"):
        recsys.serving_model(model, CONFIG | {"num_items": 6}, _datasets(_test_rows()))
