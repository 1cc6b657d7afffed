"""A tiny training module with a serving model, for the job's serving-model tests: one word in, a
class out, through a vocabulary that travels with the model (as include/models/text.py does)."""

from __future__ import annotations

from typing import Any

import mlflow.pyfunc

from include.training.loop import evaluate as loop_evaluate

CONFIG = {"label_column": "label", "inputs": [{"name": "word", "column": "word_id", "dtype": "int64"}],
          "vocab_size": 8, "batch_size": 4}  # fmt: skip


def build_model(config: dict[str, Any]):
    from torch import nn

    return nn.Embedding(int(config["vocab_size"]), 2)


def train_loop(config: dict[str, Any]) -> None:  # never run here: the tests log and score models only
    raise NotImplementedError


class WordModel(mlflow.pyfunc.PythonModel):
    """The weights and the vocabulary of one training; scores raw words."""

    def __init__(self, state: dict[str, Any], vocab: dict[str, int], config: dict[str, Any]) -> None:
        self.state, self.vocab, self.config = state, vocab, config

    def torch_model(self):
        model = build_model(self.config)
        model.load_state_dict(self.state)
        return model.eval()

    def ids(self, words) -> list[int]:
        return [self.vocab.get(w, 0) for w in words]

    def predict(self, context, model_input, params=None):
        import torch

        with torch.no_grad():
            return self.torch_model()(torch.tensor(self.ids(model_input["word"]))).argmax(1).numpy()


def serving_model(model, config: dict[str, Any], read_dataset):
    import pandas as pd

    vocab = read_dataset("vocab").to_pydict()
    python_model = WordModel(model.state_dict(), dict(zip(vocab["word"], vocab["id"], strict=True)), config)
    return python_model, pd.DataFrame({"word": ["good", "bad"]})


def evaluate(model: WordModel, config: dict[str, Any], table) -> dict[str, float]:
    """Scores through the model's own vocabulary, on the raw words the test rows keep."""
    import pyarrow as pa

    ids = pa.array(model.ids(table.column("word").to_pylist()), pa.int64())
    own = table.set_column(table.column_names.index("word_id"), "word_id", ids)  # not the generation's ids
    return loop_evaluate(model.torch_model(), config, own)
