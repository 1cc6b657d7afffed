"""The training loop's batch contract: declared columns become typed model inputs, checked where built."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from emr_ray.cluster.batches import batch_spec
from emr_ray.cluster.spec import SpecError

TABLE = pa.table(
    {
        "f0": pa.array([1.0, 2.0, 3.0]),
        "f1": pa.array([4.0, 5.0, 6.0]),
        "user": pa.array([7, 8, 9], pa.int64()),
        "tokens": pa.array([[5, 6, 7, 8], [], [9, 10]], pa.list_(pa.int64())),
        "label": pa.array([0, 1, 0], pa.int64()),
        "rank": pa.array([3, 40, 1], pa.int64()),
    }
)


def test_without_inputs_the_feature_columns_are_one_float_matrix_as_before():
    inputs, labels, extras = batch_spec({"feature_columns": ["f0", "f1"], "label_column": "label"}).tensors(
        TABLE
    )
    assert len(inputs) == 1 and inputs[0].dtype == torch.float32
    assert inputs[0].tolist() == [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]
    assert labels.dtype == torch.int64 and labels.tolist() == [0, 1, 0]
    assert extras == {}


def test_declared_inputs_come_in_call_order_with_their_dtypes_and_shapes():
    config = {
        "label_column": "label",
        "inputs": [
            {"name": "tokens", "column": "tokens", "dtype": "int64", "length": 3, "pad": 0},
            {"name": "user", "column": "user", "dtype": "int64"},
            {"name": "dense", "columns": ["f1"]},
        ],
        "metric_columns": ["rank"],
    }
    spec = batch_spec(config)
    assert spec.columns == ["tokens", "user", "f1", "label", "rank"]
    (tokens, user, dense), labels, extras = spec.tensors(TABLE)
    assert tokens.dtype == torch.int64 and tokens.tolist() == [
        [5, 6, 7],
        [0, 0, 0],
        [9, 10, 0],
    ]  # truncated, padded
    assert user.shape == (3,) and user.tolist() == [7, 8, 9]
    assert dense.shape == (3, 1) and dense.dtype == torch.float32
    assert extras["rank"].tolist() == [3.0, 40.0, 1.0]


def test_a_sliced_list_column_pads_the_rows_of_the_slice():
    config = {
        "label_column": "label",
        "inputs": [{"name": "t", "column": "tokens", "dtype": "int64", "length": 2}],
    }
    (tokens,), labels, _ = batch_spec(config).tensors(TABLE.slice(1, 2))
    assert tokens.tolist() == [[0, 0], [9, 10]] and labels.tolist() == [1, 0]


def test_no_rows_give_empty_tensors_of_the_declared_shapes():
    config = {"label_column": "label", "inputs": [{"name": "t", "column": "tokens", "dtype": "int64", "length": 4},
                                                  {"name": "x", "columns": ["f0", "f1"]}]}  # fmt: skip
    (tokens, x), labels, _ = batch_spec(config).tensors(None)
    assert tokens.shape == (0, 4) and x.shape == (0, 2) and labels.shape == (0,)


@pytest.mark.parametrize(
    ("config", "names"),
    [
        ({"feature_columns": ["a"]}, "label_column"),
        ({"label_column": "y"}, "inputs nor feature_columns"),
        ({"label_column": "y", "inputs": [{"name": "x", "column": "a", "columns": ["b"]}]}, "exactly one of"),
        (
            {"label_column": "y", "inputs": [{"name": "x", "column": "a", "dtype": "float16"}]},
            "dtype 'float16'",
        ),
        ({"label_column": "y", "inputs": [{"name": "x", "columns": ["a"], "length": 4}]}, "'length'"),
        ({"label_column": "y", "inputs": [{"column": "a"}]}, "has no name"),
        ({"label_column": "y", "inputs": [{"name": "x", "column": "a", "shape": 3}]}, "unknown key"),
        (
            {"label_column": "y", "inputs": [{"name": "x", "column": "a"}, {"name": "x", "column": "b"}]},
            "repeat",
        ),
    ],
)
def test_a_bad_declaration_is_refused_naming_the_input_and_the_fix(config, names):
    with pytest.raises(SpecError, match=names):
        batch_spec(config)


def test_the_training_spec_checks_the_declared_inputs_before_submitting():
    from emr_ray.cluster.spec import MLflowSection, TrainJobSpec

    with pytest.raises(SpecError, match="dtype 'int8'"):
        TrainJobSpec(
            train_loop="include.models.text:train_loop",
            datasets={"train": "file:///tmp/s/dt=2026-11-02/train"},
            run_name="r",
            storage_path="file:///tmp/c",
            mlflow=MLflowSection(tracking_uri="file:///tmp/m", experiment_name="e"),
            config={"label_column": "y", "inputs": [{"name": "t", "column": "t", "dtype": "int8"}]},
        )


def test_a_table_of_many_sliced_chunks_converts_row_for_row_into_fresh_tensors():
    part = pa.table({"f0": pa.array([1.0, 2.0, 3.0, 4.0], pa.float64()), "f1": pa.array([5, 6, 7, 8], pa.int32()),
                     "label": pa.array([1, 0, 1, 0], pa.int64()), "rank": pa.array([9, 8, 7, 6], pa.uint16())})  # fmt: skip
    # chunks with offsets, and an empty one
    table = pa.concat_tables([part.slice(1, 2), part.slice(0, 0), part, part.slice(3)])
    config = {"feature_columns": ["f0", "f1"], "label_column": "label", "metric_columns": ["rank"]}
    (x,), labels, extras = batch_spec(config).tensors(table)
    assert x.dtype == torch.float32 and x.tolist() == [[2, 6], [3, 7], [1, 5], [2, 6], [3, 7], [4, 8], [4, 8]]
    assert labels.tolist() == [0, 1, 1, 0, 1, 0, 0] and extras["rank"].tolist() == [8, 7, 9, 8, 7, 6, 6]
    # the tensors own their memory (a one-chunk int64 column was once a read-only view of Arrow's buffer)
    (x,), labels, _ = batch_spec(config).tensors(part)
    labels[0] = 5
    assert labels.numpy().flags.writeable and part.column("label")[0].as_py() == 1


def test_nulls_still_convert_as_pyarrow_converts_them():
    table = pa.table({"f0": pa.array([1.0, None], pa.float32()), "label": pa.array([1, 0]),
                      "tokens": pa.array([[3, 4], None], pa.list_(pa.int64()))})  # fmt: skip
    config = {"label_column": "label", "inputs": [{"name": "x", "columns": ["f0"]},
                                                  {"name": "t", "column": "tokens", "dtype": "int64", "length": 3}]}  # fmt: skip
    (x, tokens), _, _ = batch_spec(config).tensors(table)
    assert x[0].item() == 1.0 and torch.isnan(x[1]).item()
    assert tokens.tolist() == [[3, 4, 0], [0, 0, 0]]  # a null list pads its row


def test_a_fresh_worker_converts_its_shard_without_importing_pandas(tmp_path):
    """pyarrow's ``to_numpy`` imports pandas on its first call: 0.2-1.0 s of a cold read in a fresh worker."""
    import subprocess
    import sys

    import pyarrow.parquet as pq

    path = tmp_path / "part.parquet"
    pq.write_table(TABLE, path, row_group_size=2)
    code = (
        "import sys; from pyarrow import fs; from emr_ray.cluster.batches import batch_spec; "
        "from emr_ray.cluster.jobs.shards import Piece, read; "
        f"table = read([Piece({str(path)!r}, 1, 3)], fs.LocalFileSystem(), ['f0', 'f1', 'tokens', 'label']); "
        "config = {'label_column': 'label', 'inputs': [{'name': 'x', 'columns': ['f0', 'f1']}, "
        "{'name': 't', 'column': 'tokens', 'dtype': 'int64', 'length': 2}]}; "
        "(x, t), y, _ = batch_spec(config).tensors(table); "
        "assert x.tolist() == [[2, 5], [3, 6]] and t.tolist() == [[0, 0], [9, 10]] and y.tolist() == [1, 0]; "
        "print('pandas' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stderr
