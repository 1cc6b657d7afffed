"""A model version's receipt (``emr_ray.receipt``): built from what the upstream tasks returned, priced
by the user's table, and never more than what was measured."""

from __future__ import annotations

import json

import pytest

from emr_ray import receipt

#: the upstream tasks' XComs, as the Ray operators push them (emr_ray.cluster.results' JSON)
PREPROCESS = {
    "partition": "2026-12-04",
    "input_uri": "cos://bucket/raw/dt=2026-12-04",
    "rows_in": 100,
    "output_uri": "cos://bucket/staged/dt=2026-12-04",
    "generation": "g1",
    "raw_input": "3 files, 81,234 bytes, _SUCCESS of 2026-12-04T10:00:00+00:00, listing 1a2b3c4d5e6f",
    "code_version": "0.9.0+aaaa",
    "versions": {"python": "3.11.7", "pyspark": "3.5.5"},
    "usage": {"wall_seconds": 20.0, "cpu_seconds_reserved": 30.0, "gpu_seconds_reserved": 0.0,
              "pool_idle": {"seconds": 60.0, "cpu_seconds": 60.0, "gpu_seconds": 0.0}},
}  # fmt: skip
TRAIN = {
    "mlflow_run_id": "r1",
    "tracking_uri": "http://127.0.0.1:5000",
    "run_name": "tabular",
    "checkpoint_uri": "file:///ck/tabular/best",
    "final_metrics": {"test_loss": 0.3},
    "code_version": "0.9.0+aaaa",
    "versions": {"python": "3.11.7", "ray": "2.60.0", "torch": "2.13.0"},
    "inputs_fingerprint": "f" * 16,
    "usage": {"wall_seconds": 40.0, "cpu_seconds_reserved": 80.0, "gpu_seconds_reserved": 36.0},
}


def test_the_receipt_sums_each_tasks_seconds_with_its_share_of_idle_pools_and_names_code_and_inputs():
    tags = receipt.tags(
        {"preprocess": PREPROCESS, "train": TRAIN, "check_cluster": {"ok": True}, "sense": None}
    )
    tasks = json.loads(tags["receipt.tasks"])
    assert set(tasks) == {"preprocess", "train"}  # only tasks that measured their usage
    assert tasks["preprocess"]["pool_idle_cpu_seconds"] == 60.0
    assert tags["receipt.cpu_seconds"] == "170.0" and tags["receipt.gpu_seconds"] == "36.0"
    assert tags["receipt.code_version"] == "0.9.0+aaaa" and tags["receipt.inputs"] == "f" * 16
    assert tags["receipt.raw_input"] == PREPROCESS["raw_input"]  # what a duplicate arrival is matched on
    assert "ray=2.60.0" in tags["receipt.versions"] and "torch=2.13.0" in tags["receipt.versions"]
    assert "receipt.cost" not in tags  # no price table, no money


def test_a_price_table_turns_the_seconds_into_money():
    prices, problem = receipt.parse_prices('{"cpu_hour": 0.36, "gpu_hour": 3.6, "currency": "USD"}')
    tags = receipt.tags({"train": TRAIN}, prices)
    assert problem is None
    assert (
        tags["receipt.cost"] == f"{80 / 3600 * 0.36 + 36 / 3600 * 3.6:.4f}"
        and tags["receipt.currency"] == "USD"
    )


@pytest.mark.parametrize("raw", ["not json", '{"cpu": 1}', "[1, 2]"])
def test_a_price_table_that_cannot_be_used_says_why_and_prices_nothing(raw):
    prices, problem = receipt.parse_prices(raw)
    assert prices is None and receipt.PRICES_VARIABLE in problem
    assert "receipt.cost" not in receipt.tags({"train": TRAIN}, prices)
