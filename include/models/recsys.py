"""A two-tower recommender over indexed users and items, its Ray Train loop, metrics and serving model.

Towers: a user is their embedding plus the mean embedding of their recent items (``history``, so
item-to-item taste carries over); an item is its embedding and a popularity bias. The score of a
(user, item) pair is their dot product plus the bias; the loop trains it as a two-class scorer
(logits ``[0, score]``) on the positives and sampled negatives of :mod:`include.preprocessing.recsys`.

Metrics per test row (one held-out item per user), beside test_loss and test_accuracy:

- ``recall_at_10``: the held-out item is among the model's top 10 of every item the user has not
  touched in training (all items scored, the history masked out);
- ``ndcg_at_10``: the same, discounted by the position (``1 / log2(rank + 1)``);
- ``popularity_recall_at_10``: the popularity baseline's recall, from the rank Spark computed
  exactly on the same candidate set (``metric_columns``). In the same run, so it is a bar the model
  must clear, not a figure from elsewhere.

:func:`serving_model` logs a pyfunc model (:class:`include.models.recsys_serving.RecsysModel`) that keeps the id indexes and the users'
histories of the generation it was trained on, takes raw ``user_id`` and ``item_id`` strings and
returns scores (its ``recommend`` gives the top k). :func:`evaluate` scores such models
(the new one and a champion trained on another day, with another index) through their own indexes
on raw ids, so the champion comparison is like for like.
"""

from __future__ import annotations

from typing import Any

from include.training import loop

__all__ = ["METRICS", "build_model", "evaluate", "serving_model", "train_loop"]

K = 10
#: the user's training history the model reads and every ranking excludes (list column ``history``)
HISTORY = "history"


def history_length(config: dict[str, Any]) -> int:
    """The padded length of the ``history`` input the config declares (64 when it declares none)."""
    for declared in config.get("inputs") or []:
        if declared.get("name") == HISTORY and declared.get("length"):
            return int(declared["length"])
    return 64


def build_model(config: dict[str, Any]):
    """The two-tower model for ``num_users`` users and ``num_items`` items (index 0 is padding/unknown)."""
    import torch
    from torch import nn

    try:
        num_users, num_items = int(config["num_users"]), int(config["num_items"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(
            f"The recsys config needs num_users and num_items (the sizes of the users and items indexes "
            f"the preprocessing wrote), got {config.get('num_users')!r} and {config.get('num_items')!r}."
        ) from e
    dim = int(config.get("embedding_dim", 32))

    class TwoTower(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.user = nn.Embedding(num_users + 1, dim, padding_idx=0)
            self.history = nn.Embedding(num_items + 1, dim, padding_idx=0)
            self.item = nn.Embedding(num_items + 1, dim, padding_idx=0)
            self.bias = nn.Embedding(num_items + 1, 1, padding_idx=0)
            for table in (self.user, self.history, self.item):
                nn.init.normal_(table.weight, std=0.1)
                with torch.no_grad():
                    table.weight[0].zero_()
            nn.init.zeros_(self.bias.weight)

        def user_vector(self, user, history):
            """``[n, dim]``: the user's embedding plus the mean of their history's (padding ignored)."""
            known = (history > 0).unsqueeze(-1).float()
            pooled = (self.history(history) * known).sum(1) / known.sum(1).clamp(min=1.0)
            return self.user(user) + pooled

        def score_all(self, user, history):
            """``[n, num_items + 1]``: the score of every item (column 0 is padding) for each row."""
            return self.user_vector(user, history) @ self.item.weight.T + self.bias.weight.T

        def forward(self, user, item, history):
            score = (self.user_vector(user, history) * self.item(item)).sum(-1) + self.bias(item).squeeze(-1)
            return torch.stack([torch.zeros_like(score), score], 1)

    return TwoTower()


def ranks(scores, item, history):
    """The 1-based rank of ``item`` in each row of ``scores`` among the items not in ``history``.

    Column 0 (padding, unknown) and the history are never candidates. Ties count in the item's
    favour: only strictly higher scores rank above it. An unknown item (index 0) gets no rank (inf).
    """
    import torch

    masked = scores.clone()
    masked[:, 0] = -torch.inf
    masked.scatter_(1, history, -torch.inf)
    target = scores.gather(1, item.unsqueeze(1))
    rank = (masked > target).sum(1).double() + 1
    return torch.where(item > 0, rank, torch.full_like(rank, torch.inf))


def _ranks_of(model, inputs):
    user, item, history = inputs
    return ranks(getattr(model, "module", model).score_all(user, history), item, history)


def _recall(model, inputs, labels, logits, extras) -> float:
    return float(((_ranks_of(model, inputs) <= K) & (labels == 1)).sum())


def _ndcg(model, inputs, labels, logits, extras) -> float:
    import torch

    rank = _ranks_of(model, inputs)
    gain = torch.where((rank <= K) & (labels == 1), 1.0 / torch.log2(rank + 1), torch.zeros_like(rank))
    return float(gain.sum())


def _popularity(model, inputs, labels, logits, extras) -> float:
    return float(extras["popularity_hit_at_10"].sum())


#: the loop's extra test metrics (sums over a batch; the loop divides by the test rows)
METRICS = {"recall_at_10": _recall, "ndcg_at_10": _ndcg, "popularity_recall_at_10": _popularity}


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train worker loop (see :func:`include.training.loop.run_epochs`), with the ranking metrics."""
    loop.run_epochs(config, build_model, extra_metrics=METRICS)


def serving_model(model, config: dict[str, Any], read_dataset) -> tuple[Any, Any]:
    """The pyfunc model (weights plus this generation's ``users`` and ``items`` indexes) and an input
    example of raw ids (three test rows)."""
    from include.models.recsys_serving import RecsysModel

    users = read_dataset("users").sort_by("user_idx")
    items = read_dataset("items").sort_by("item_idx")
    _check_index(users.column("user_idx").to_pylist(), "users", config.get("num_users"))
    _check_index(items.column("item_idx").to_pylist(), "items", config.get("num_items"))
    user_ids = users.column("user_id").to_pylist()
    histories = dict(zip(user_ids, users.column("history_items").to_pylist(), strict=True))
    unwrapped = getattr(model, "module", model)
    python_model = RecsysModel(
        unwrapped.state_dict(), config, user_ids, items.column("item_id").to_pylist(), histories
    )
    example = read_dataset("test").select(["user_id", "item_id"]).slice(0, 3).to_pandas()
    return python_model, example


def _check_index(indexes: list[int], name: str, size: Any) -> None:
    if indexes != list(range(1, len(indexes) + 1)) or (size is not None and int(size) != len(indexes)):
        raise ValueError(
            f"The {name} index is not 1..{size} (it has {len(indexes)} rows); pass the {name} dataset of the "
            f"same generation as train and test, and num_{name} = its row count."
        )


def evaluate(model, config: dict[str, Any], table) -> dict[str, float]:
    """Test metrics of ``model`` on test rows (a pyarrow table with every column).

    A served model (``RecsysModel``, as in the champion comparison) is scored through its own indexes on the raw
    ``user_id``, ``item_id`` and ``seen_items``: a champion from another day with another index ranks
    the same held-out items, excluding the same seen items, as the new model. A torch module (the
    trained weights) is scored on the index columns, as in the loop.
    """
    if not hasattr(model, "item_index"):
        return loop.evaluate(model, config, table, extra_metrics=METRICS)
    import torch

    sums = torch.zeros(5, dtype=torch.float64)  # loss, correct, hits, ndcg, rows whose item it knows
    batch = int(config.get("batch_size", 256))
    for offset in range(0, table.num_rows, batch):  # [rows, items] scores, a batch at a time
        rows = table.slice(offset, batch)
        scores, history = model.score_all(
            rows.column("user_id").to_pylist(), rows.column("seen_items").to_pylist()
        )
        items = torch.tensor([model.item_index.get(i, 0) for i in rows.column("item_id").to_pylist()])
        labels = torch.tensor(rows.column("label").to_pylist(), dtype=torch.long)
        rank = ranks(scores, items, history)
        score = scores.gather(1, items.unsqueeze(1)).squeeze(1)
        logits = torch.stack([torch.zeros_like(score), score], 1)
        known = items > 0  # an item this model never saw has no score: a miss, outside the loss
        hit = (rank <= K) & (labels == 1)
        sums += torch.tensor(
            [
                float(torch.nn.functional.cross_entropy(logits[known], labels[known], reduction="sum")),
                float(((logits.argmax(1) == labels) & known).sum()),
                float(hit.sum()),
                float(torch.where(hit, 1.0 / torch.log2(rank + 1), torch.zeros_like(rank)).sum()),
                float(known.sum()),
            ],
            dtype=torch.float64,
        )
    n = max(table.num_rows, 1)
    return {
        "test_loss": sums[0].item() / max(sums[4].item(), 1),
        "test_accuracy": sums[1].item() / n,
        "recall_at_10": sums[2].item() / n,
        "ndcg_at_10": sums[3].item() / n,
        "popularity_recall_at_10": sum(table.column("popularity_hit_at_10").to_pylist()) / n,
    }
