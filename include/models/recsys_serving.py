"""The recommender as MLflow serves it: a pyfunc model over raw user and item ids.

Kept apart from :mod:`include.models.recsys` because it subclasses ``mlflow.pyfunc.PythonModel``
(MLflow imported at the top): the training module stays cheap to import on the workers, and a
pickled model refers to this class by its import path (``code_paths`` ships ``include/``).
"""

from __future__ import annotations

import mlflow.pyfunc
import pandas as pd

from include.models.recsys import K, build_model, history_length


class RecsysModel(mlflow.pyfunc.PythonModel):
    """The servable recommender: weights, the id indexes and histories of its training generation.

    Pickled with the model (by cloudpickle, through MLflow): plain lists, dicts and CPU tensors; the
    torch module is rebuilt on first use. Unknown users score from popularity and any history given;
    unknown items score NaN (they cannot be ranked).
    """

    def __init__(self, state_dict, config, user_ids, item_ids, histories) -> None:
        self.state_dict = {k: v.detach().cpu().clone() for k, v in state_dict.items()}
        self.config = {k: config[k] for k in ("num_users", "num_items", "embedding_dim") if k in config}
        self.max_history = history_length(config)
        self.user_index = {u: i for i, u in enumerate(user_ids, start=1)}
        self.item_ids = ["", *item_ids]  # position = item_idx; 0 is padding
        self.item_index = {item: i for i, item in enumerate(item_ids, start=1)}
        self.histories = dict(histories)
        self._module = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_module"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._module = None

    @property
    def module(self):
        if self._module is None:
            module = build_model(self.config)
            module.load_state_dict(self.state_dict)
            self._module = module.eval()
        return self._module

    def _history_tensor(self, histories):
        """Raw item-id lists -> ``[n, max_history]`` indexes in this model's index (unknown ids dropped)."""
        import torch

        rows = [
            [self.item_index[i] for i in (h or []) if i in self.item_index][: self.max_history]
            for h in histories
        ]
        out = torch.zeros((len(rows), self.max_history), dtype=torch.long)
        for r, row in enumerate(rows):
            out[r, : len(row)] = torch.tensor(row, dtype=torch.long)
        return out

    def score_all(self, user_ids, histories=None):
        """``(scores [n, items + 1], history indexes)`` for raw user ids; ``histories`` (raw item ids per
        row) default to the users' histories from training."""
        import torch

        if histories is None:
            histories = [self.histories.get(u, []) for u in user_ids]
        users = torch.tensor([self.user_index.get(u, 0) for u in user_ids], dtype=torch.long)
        history = self._history_tensor(histories)
        with torch.no_grad():
            return self.module.score_all(users, history), history

    def predict(self, context, model_input: pd.DataFrame, params=None):
        """Scores of (``user_id``, ``item_id``) rows of a DataFrame; NaN for an item it does not know."""
        import numpy as np
        import torch

        scores, _ = self.score_all(list(model_input["user_id"]))
        items = torch.tensor([self.item_index.get(i, 0) for i in model_input["item_id"]], dtype=torch.long)
        picked = scores.gather(1, items.unsqueeze(1)).squeeze(1).numpy().astype("float64")
        return np.where(items.numpy() > 0, picked, np.nan)

    def recommend(self, user_ids, k: int = K) -> list[list[str]]:
        """The top ``k`` items per user among those not in the user's history, as raw ids."""
        import torch

        scores, history = self.score_all(list(user_ids))
        scores[:, 0] = -torch.inf
        scores.scatter_(1, history, -torch.inf)
        top = scores.topk(min(k, len(self.item_ids) - 1), dim=1).indices
        return [[self.item_ids[i] for i in row] for row in top.tolist()]
