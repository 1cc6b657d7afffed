"""The Ray Train worker loop shared by the project's models (runs on Ray Train workers).

Each worker reads its own rows of the staged Parquet once (:func:`emr_ray.train.worker_shard`:
pyarrow straight into tensors), trains on minibatches reshuffled every epoch (seeded, so a resumed
run sees the same order), evaluates on its test rows (metrics all-reduced over workers), and
reports per-epoch metrics with a checkpoint from rank 0 (:func:`emr_ray.train.report_epoch`). It
resumes from the latest checkpoint (:func:`emr_ray.train.latest_state`) when Ray Train or an
Airflow retry restarts it. It uses only the public ``emr_ray.train`` API.

:func:`evaluate` scores any model on a table of test rows with the same loss and accuracy as the
loop's epochs: the training job uses it to score the champion and the new model on the same rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from emr_ray import train as emr_train


def _tensors(config: dict[str, Any], name: str):
    """This worker's rows of dataset ``name`` as ``(features float32 [n, f], labels int64 [n])``."""
    features, label = list(config["feature_columns"]), config["label_column"]
    return _table_tensors(config, emr_train.worker_shard(config, name, features + [label]))


def _table_tensors(config: dict[str, Any], table):
    """The rows of a pyarrow ``table`` as ``(features float32 [n, f], labels int64 [n])``."""
    import numpy as np
    import torch

    features, label = list(config["feature_columns"]), config["label_column"]
    if table is None:
        return torch.empty((0, len(features))), torch.empty((0,), dtype=torch.long)
    x = np.empty((table.num_rows, len(features)), dtype=np.float32)
    for j, column in enumerate(features):
        x[:, j] = table.column(column).to_numpy()
    y = np.ascontiguousarray(table.column(label).to_numpy(), dtype=np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def _batches(data, batch_size: int, device, order=None):
    x, y = data
    for i in range(0, len(y), batch_size):
        index = order[i : i + batch_size] if order is not None else slice(i, i + batch_size)
        yield x[index].to(device), y[index].to(device)


def _sums(model, data, batch_size: int, device, loss_fn):
    """``(summed loss, correct, rows)`` of ``model`` over ``data``, without gradients."""
    import torch

    loss = correct = rows = 0.0
    with torch.no_grad():
        for x, y in _batches(data, batch_size, device):
            logits = model(x)
            loss += loss_fn(logits, y).item()
            correct += (logits.argmax(dim=1) == y).sum().item()
            rows += len(y)
    return loss, correct, rows


def evaluate(model, config: dict[str, Any], table) -> dict[str, float]:
    """``test_loss`` and ``test_accuracy`` of ``model`` on the rows of a pyarrow ``table``, on the CPU.

    The same figures the loop reports per epoch (mean cross-entropy, share of correct argmax), for
    any model that maps the ``feature_columns`` to class logits: the trained one, or the champion
    as MLflow loads it (an exported graph, already in eval mode, refuses ``.eval()``).
    """
    import torch

    try:
        model.eval()
    except NotImplementedError:
        pass
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    data = _table_tensors(config, table)
    loss, correct, rows = _sums(model, data, int(config.get("batch_size", 256)), torch.device("cpu"), loss_fn)
    return {"test_loss": loss / max(rows, 1), "test_accuracy": correct / max(rows, 1)}


def run_epochs(config: dict[str, Any], build_model: Callable[[dict[str, Any]], Any]) -> None:
    """Train ``build_model(config)``: evaluate, report and checkpoint once per epoch."""
    import torch
    import torch.distributed as dist
    from ray.train.torch import get_device, prepare_model

    seed = int(config.get("seed", 42))
    torch.manual_seed(seed)
    device = get_device()
    model = build_model(config)
    resumed = emr_train.latest_state()
    if resumed:
        model.load_state_dict(resumed.model)
    start_epoch = resumed.epoch + 1 if resumed else 0
    model = prepare_model(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=float(config.get("lr", 1e-3)))
    if resumed and resumed.optimizer:
        optimizer.load_state_dict(resumed.optimizer)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    train, test = _tensors(config, "train"), _tensors(config, "test")
    batch_size = int(config.get("batch_size", 256))
    distributed = dist.is_available() and dist.is_initialized()

    for epoch in range(start_epoch, int(config.get("epochs", 5))):
        started = time.monotonic()
        model.train()
        # train loss, train rows, test loss, correct, test rows; on the device, as NCCL reduces no CPU tensors
        sums = torch.zeros(5, dtype=torch.float64, device=device)
        order = torch.randperm(len(train[1]), generator=torch.Generator().manual_seed(seed + epoch))
        for x, y in _batches(train, batch_size, device, order):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            (loss / len(y)).backward()
            optimizer.step()
            sums[0] += loss.item()
            sums[1] += len(y)
        model.eval()
        test_loss, correct, test_rows = _sums(model, test, batch_size, device, loss_fn)
        sums[2] += test_loss
        sums[3] += correct
        sums[4] += test_rows
        if distributed:
            dist.all_reduce(sums)
        seconds = time.monotonic() - started
        metrics = {
            "train_loss": sums[0].item() / max(sums[1].item(), 1),
            "test_loss": sums[2].item() / max(sums[4].item(), 1),
            "test_accuracy": sums[3].item() / max(sums[4].item(), 1),
            "train_rows": int(sums[1].item()),
            "rows_per_second": sums[1].item() / max(seconds, 1e-9),
            "start_epoch": start_epoch,  # > 0 when this attempt resumed from a checkpoint
        }
        emr_train.report_epoch(metrics, model=model, optimizer=optimizer, epoch=epoch)
