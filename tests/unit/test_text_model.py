"""The text classifier (include/models/text.py): the torch module the loop trains, and the serving
model MLflow logs (weights plus vocabulary, raw text in), scored by ``evaluate`` through its own vocabulary."""

from __future__ import annotations

import pickle

import pandas as pd
import pyarrow as pa
import pytest
import torch

from include.models import text as model_module
from include.preprocessing.text import token_ids

CONFIG = {"inputs": [{"name": "tokens", "column": "tokens", "dtype": "int64", "length": 8, "pad": 0}],
          "label_column": "label", "num_classes": 2, "vocab_size": 6, "embedding_dim": 4}  # fmt: skip
VOCAB = {"good": 2, "bad": 3, "not": 4, "not_good": 5, "not_bad": 6, "the": 7}


def sentiment_weights(vocab: dict[str, int]) -> torch.nn.Module:
    """A module that reads positive words and "not_bad" as class 1, negative ones and "not_good" as 0."""
    model = model_module.build_model(CONFIG)
    polarity = {"good": 1.0, "bad": -1.0, "not_good": -3.0, "not_bad": 3.0}
    with torch.no_grad():
        model.bag.weight.zero_()
        for token, sign in polarity.items():
            model.bag.weight[vocab[token], 0] = sign
        model.head.weight.zero_()
        model.head.bias.zero_()
        model.head.weight[1, 0], model.head.weight[0, 0] = 10.0, -10.0
    return model.eval()


def test_the_bag_ignores_padding_so_a_padded_review_scores_as_the_bare_one():
    model = sentiment_weights(VOCAB)
    bare = torch.tensor([[4, 5, 2]])
    padded = torch.tensor([[4, 5, 2, 0, 0, 0, 0, 0]])
    assert torch.allclose(model(bare), model(padded))
    assert model(torch.zeros((1, 8), dtype=torch.long)).shape == (1, 2)  # an empty review still scores


def test_ids_beyond_the_embedding_table_name_the_vocab_size_to_fix():
    with pytest.raises(ValueError, match="vocab_size must be the preprocess step's"):
        model_module.build_model(CONFIG)(torch.tensor([[8]]))
    with pytest.raises(ValueError, match="set it to the preprocess step's vocab_size"):
        model_module.build_model({**CONFIG, "vocab_size": None})


def serving(weights_vocab=VOCAB, vocab=VOCAB):
    table = pa.table({"token": list(vocab), "id": pa.array(list(vocab.values()), pa.int64())})
    return model_module.serving_model(sentiment_weights(weights_vocab), CONFIG, lambda name: table)


def test_the_serving_model_takes_raw_text_and_holds_its_vocabulary():
    python_model, example = serving()
    assert list(example.columns) == ["text"] and len(example) == 2
    assert python_model.vocab == VOCAB
    out = python_model.predict(None, pd.DataFrame({"text": ["NOT good!", "Not bad at all", "good"]}))
    assert out["label"].tolist() == [0, 1, 1]
    assert out["confidence"].between(0.5, 1.0).all()


def test_the_serving_model_pads_and_truncates_as_the_loop_does():
    python_model, _ = serving()
    encoded = python_model.encode(["good", "the " * 10])
    assert encoded[0].tolist() == [2, 0, 0, 0, 0, 0, 0, 0]
    assert encoded[1].tolist() == token_ids("the " * 10, VOCAB)[:8]


def test_the_serving_model_pickles_without_a_torch_module_and_predicts_after():
    python_model, example = serving()
    python_model.predict(None, example)
    loaded = pickle.loads(pickle.dumps(python_model))
    assert loaded._module is None
    assert loaded.predict(None, example).equals(python_model.predict(None, example))


def test_predict_names_the_text_column_it_needs():
    python_model, _ = serving()
    with pytest.raises(ValueError, match="DataFrame with a 'text' column"):
        python_model.predict(None, pd.DataFrame({"review": ["good"]}))


def test_evaluate_scores_each_serving_model_through_its_own_vocabulary():
    # another generation numbered the tokens differently; its weights follow its own numbering
    other = {"good": 7, "bad": 6, "not": 5, "not_good": 4, "not_bad": 3, "the": 2}
    rows = pa.table({"text": ["good", "not good", "bad", "not bad"], "label": pa.array([1, 0, 0, 1], pa.int64()),
                     "tokens": pa.array([[2], [4, 5, 2], [3], [4, 6, 3]], pa.list_(pa.int64()))})  # fmt: skip
    for weights_vocab in (VOCAB, other):
        python_model, _ = serving(weights_vocab, weights_vocab)
        figures = model_module.evaluate(python_model, CONFIG, rows)
        assert figures["test_accuracy"] == 1.0 and figures["test_loss"] < 0.01
    # the torch module itself reads the tokens column, as the training loop does
    assert model_module.evaluate(sentiment_weights(VOCAB), CONFIG, rows)["test_accuracy"] == 1.0


def test_the_serving_model_needs_one_token_list_padded_with_zero():
    padded_with_one = {**CONFIG, "inputs": [{**CONFIG["inputs"][0], "pad": 1}]}
    for config in (padded_with_one, {**CONFIG, "inputs": []}):
        with pytest.raises(ValueError, match="exactly one list input in config\\['inputs'\\], padded with 0"):
            model_module.TextSentimentModel(sentiment_weights(VOCAB).state_dict(), VOCAB, config)
