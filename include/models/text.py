"""A fastText-style sentiment classifier over token ids, its Ray Train loop, and its serving model.

The Spark step (:mod:`include.preprocessing.text`) turns each review into token ids: words and
adjacent word pairs ("not_good"), so the mean of their embeddings, followed by a linear head, tells
"not good" from "good" (a mean of word embeddings alone cannot). The loop feeds the ``tokens``
list column padded to ``[n, length]`` (0 pads, and the bag ignores it).

The logged model is :class:`TextSentimentModel`, an MLflow Python model that holds the weights and
the vocabulary of the generation it was trained on, and takes raw text: it tokenises with the same
rule as the Spark step (:func:`include.preprocessing.text.token_ids`). :func:`evaluate` scores such
models on raw test rows, so a champion with another vocabulary is scored through its own.
"""

from __future__ import annotations

from typing import Any

import mlflow.pyfunc

from include.preprocessing.text import FIRST_ID, PAD, token_ids
from include.training import loop

__all__ = ["TextSentimentModel", "build_model", "evaluate", "serving_model", "train_loop"]


def _embeddings(config: dict[str, Any]) -> int:
    """Rows of the embedding table: the vocabulary's ids plus pad and unknown."""
    size = int(config.get("vocab_size") or 0)
    if size < 1:
        raise ValueError(
            f"The text model's config has vocab_size={config.get('vocab_size')!r}; set it to the "
            "preprocess step's vocab_size (the largest id is vocab_size + 1)."
        )
    return size + FIRST_ID


def build_model(config: dict[str, Any]):
    """Mean of token embeddings (the pad excluded) and a linear head: ``model(tokens [n, L]) -> [n, C]``."""
    from torch import nn

    class BagOfTokens(nn.Module):
        def __init__(self, embeddings: int, dim: int, classes: int, dropout: float):
            super().__init__()
            self.bag = nn.EmbeddingBag(embeddings, dim, mode="mean", padding_idx=PAD)
            self.dropout = nn.Dropout(dropout)
            self.head = nn.Linear(dim, classes)

        def forward(self, tokens):
            if tokens.numel() and int(tokens.max()) >= self.bag.num_embeddings:
                raise ValueError(
                    f"token id {int(tokens.max())} is outside the model's {self.bag.num_embeddings} "
                    "embeddings; the train step's vocab_size must be the preprocess step's."
                )
            return self.head(self.dropout(self.bag(tokens)))

    return BagOfTokens(
        _embeddings(config),
        int(config.get("embedding_dim", 32)),
        int(config.get("num_classes", 2)),
        float(config.get("dropout", 0.0)),
    )


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train worker loop (see :func:`include.training.loop.run_epochs`)."""
    loop.run_epochs(config, build_model)


def _token_input(config: dict[str, Any]) -> dict[str, Any]:
    """The declared ``tokens`` input (its ``length`` and ``pad``), as the loop reads it."""
    declared = [i for i in config.get("inputs") or [] if "length" in i]
    if len(declared) != 1 or declared[0].get("pad", 0) != PAD:
        raise ValueError(
            "The text model needs exactly one list input in config['inputs'], padded with 0 (the id "
            "its bag ignores), like {'name': 'tokens', 'column': 'tokens', 'dtype': 'int64', 'length': 64, 'pad': 0}."
        )
    return declared[0]


class TextSentimentModel(mlflow.pyfunc.PythonModel):
    """Raw text in, class labels out: the trained weights and the vocabulary they were trained with.

    ``predict`` takes a DataFrame with a ``text`` column (or the configured ``text_column``) and
    returns ``label`` and ``confidence`` (the probability of that label). The torch module is rebuilt
    lazily from the state dict, so the object pickles small and without a torch module in it.
    """

    def __init__(self, state_dict: dict[str, Any], vocab: dict[str, int], config: dict[str, Any]):
        self.state_dict = {k: v.detach().cpu().clone() for k, v in state_dict.items()}
        self.vocab = dict(vocab)
        spec = _token_input(config)
        self.config = {
            "vocab_size": int(config["vocab_size"]),
            "embedding_dim": int(config.get("embedding_dim", 32)),
            "num_classes": int(config.get("num_classes", 2)),
            "text_column": config.get("text_column", "text"),
            "length": int(spec["length"]),
        }
        self._module = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_module"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _module=None)

    def encode(self, texts) -> Any:
        """Token ids of ``texts`` as the loop feeds them: ``[n, length]`` int64, first ids kept, 0 pads."""
        import numpy as np
        import torch

        length = self.config["length"]
        out = np.full((len(texts), length), PAD, dtype=np.int64)
        for row, text in enumerate(texts):
            ids = token_ids(text, self.vocab)[:length]
            out[row, : len(ids)] = ids
        return torch.from_numpy(out)

    def logits(self, texts) -> Any:
        """Class logits ``[n, C]`` of raw ``texts`` (a list or Series of strings), without gradients."""
        import torch

        if self._module is None:
            module = build_model({**self.config, "dropout": 0.0})
            module.load_state_dict(self.state_dict)
            self._module = module.eval()
        with torch.no_grad():
            return self._module(self.encode(list(texts)))

    def predict(self, context, model_input, params=None):
        """``label`` and ``confidence`` for each row of ``model_input`` (a DataFrame with the text column)."""
        import pandas as pd

        column = self.config["text_column"]
        if not isinstance(model_input, pd.DataFrame) or column not in model_input.columns:
            got = (
                list(model_input.columns)
                if isinstance(model_input, pd.DataFrame)
                else type(model_input).__name__
            )
            raise ValueError(f"predict needs a DataFrame with a {column!r} column of raw text; got {got}.")
        probabilities = self.logits(model_input[column].tolist()).softmax(dim=1)
        confidence, label = probabilities.max(dim=1)
        return pd.DataFrame({"label": label.numpy().astype("int64"), "confidence": confidence.numpy()})


def serving_model(model, config: dict[str, Any], read_dataset) -> tuple[TextSentimentModel, Any]:
    """The trained module with this generation's vocabulary, and two raw texts as the input example."""
    import pandas as pd

    table = read_dataset("vocab")
    if table is None or not {"token", "id"} <= set(table.column_names):
        raise ValueError(
            "The 'vocab' dataset needs token and id columns (include.preprocessing.text:tokenize)."
        )
    vocab = dict(zip(table.column("token").to_pylist(), table.column("id").to_pylist(), strict=True))
    module = getattr(model, "module", model)
    example = pd.DataFrame(
        {config.get("text_column", "text"): ["The battery was not good at all.", "I really love it!"]}
    )
    return TextSentimentModel(module.state_dict(), vocab, config), example


def evaluate(model, config: dict[str, Any], table) -> dict[str, float]:
    """``test_loss`` and ``test_accuracy`` on the rows of a pyarrow ``table``.

    A :class:`TextSentimentModel` (the new model or a champion, each with its own vocabulary) reads
    the raw text column; a torch module reads the ``tokens`` column, as the loop does.
    """
    if not isinstance(model, TextSentimentModel):
        return loop.evaluate(model, config, table)
    import numpy as np
    import torch

    texts = table.column(model.config["text_column"]).to_pylist()
    labels = torch.from_numpy(
        np.array(table.column(config.get("label_column", "label")).to_numpy(), dtype=np.int64)
    )
    batch = int(config.get("batch_size", 256))
    loss = correct = 0.0
    for start in range(0, len(texts), batch):
        logits = model.logits(texts[start : start + batch])
        y = labels[start : start + batch]
        loss += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
        correct += float((logits.argmax(dim=1) == y).sum())
    rows = max(len(texts), 1)
    return {"test_loss": loss / rows, "test_accuracy": correct / rows}
