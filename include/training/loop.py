"""The Ray Train worker loop shared by the project's models (runs on Ray Train workers).

Each worker reads its own rows of the staged Parquet once (:func:`emr_ray.cluster.train.worker_shard`:
pyarrow straight into tensors), trains on minibatches reshuffled every epoch (seeded, so a resumed
run sees the same order), evaluates on its test rows (metrics all-reduced over workers), and
reports per-epoch metrics with a checkpoint from rank 0 (:func:`emr_ray.cluster.train.report_epoch`). It
resumes from the latest checkpoint (:func:`emr_ray.cluster.train.latest_state`) when Ray Train or an
Airflow retry restarts it. It uses only the public ``emr_ray.cluster.train`` API.

Batches follow :mod:`emr_ray.cluster.batches`: the config declares the model's typed inputs (a float matrix of
feature columns, int ids, padded token lists), and the loop calls ``model(*inputs)`` for class logits
with a cross-entropy loss. ``extra_metrics`` adds per-epoch test metrics (a ranking metric, a
baseline's score) as batch sums that the loop adds up over batches and workers and divides by the
test rows, beside ``test_loss`` and ``test_accuracy``.

:func:`evaluate` scores any model on a table of test rows with the same figures as the loop's
epochs: the training job uses it to score the champion and the new model on the same rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from emr_ray.cluster import batches as contract
from emr_ray.cluster import train as emr_train

#: ``fn(model, inputs, labels, logits, extras) -> sum over the batch``; the loop divides by the test rows
ExtraMetric = Callable[[Any, tuple, Any, Any, dict], float]


def _tensors(config: dict[str, Any], name: str):
    """This worker's rows of dataset ``name`` as ``(inputs, labels, extras)`` (see :mod:`emr_ray.cluster.batches`)."""
    spec = contract.batch_spec(config)
    return spec.tensors(emr_train.worker_shard(config, name, spec.columns))


def _batches(data, batch_size: int, device, order=None):
    inputs, y, extras = data
    for i in range(0, len(y), batch_size):
        index = order[i : i + batch_size] if order is not None else slice(i, i + batch_size)
        yield (
            tuple(x[index].to(device) for x in inputs),
            y[index].to(device),
            {k: v[index].to(device) for k, v in extras.items()},
        )


def _sums(model, data, batch_size: int, device, loss_fn, extra_metrics: Mapping[str, ExtraMetric]):
    """``[summed loss, correct, rows, *extra sums]`` of ``model`` over ``data``, without gradients."""
    import torch

    sums = [0.0] * (3 + len(extra_metrics))
    with torch.no_grad():
        for inputs, y, extras in _batches(data, batch_size, device):
            logits = model(*inputs)
            sums[0] += loss_fn(logits, y).item()
            sums[1] += (logits.argmax(dim=1) == y).sum().item()
            sums[2] += len(y)
            for j, metric in enumerate(extra_metrics.values()):
                sums[3 + j] += float(metric(model, inputs, y, logits, extras))
    return sums


def _test_metrics(sums: list[float], extra_metrics: Mapping[str, ExtraMetric]) -> dict[str, float]:
    rows = max(sums[2], 1)
    metrics = {"test_loss": sums[0] / rows, "test_accuracy": sums[1] / rows}
    metrics |= {name: sums[3 + j] / rows for j, name in enumerate(extra_metrics)}
    return metrics


def evaluate(
    model, config: dict[str, Any], table, extra_metrics: Mapping[str, ExtraMetric] | None = None
) -> dict[str, float]:
    """``test_loss``, ``test_accuracy`` and the ``extra_metrics`` of ``model`` on a pyarrow ``table``, on the CPU.

    The same figures the loop reports per epoch, for any model that maps the declared inputs to class
    logits: the trained one, or the champion as MLflow loads it (an exported graph, already in eval
    mode, refuses ``.eval()``).
    """
    import torch

    try:
        model.eval()
    except NotImplementedError:
        pass
    extra_metrics = extra_metrics or {}
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    data = contract.batch_spec(config).tensors(table)
    sums = _sums(model, data, int(config.get("batch_size", 256)), torch.device("cpu"), loss_fn, extra_metrics)
    return _test_metrics(sums, extra_metrics)


def run_epochs(
    config: dict[str, Any],
    build_model: Callable[[dict[str, Any]], Any],
    extra_metrics: Mapping[str, ExtraMetric] | None = None,
) -> None:
    """Train ``build_model(config)``: evaluate, report and checkpoint once per epoch."""
    import torch
    import torch.distributed as dist

    extra_metrics = extra_metrics or {}
    seed = int(config.get("seed", 42))
    torch.manual_seed(seed)
    device = emr_train.device()
    model = build_model(config)
    resumed = emr_train.latest_state()
    if resumed:
        model.load_state_dict(resumed.model)
    start_epoch = resumed.epoch + 1 if resumed else 0
    model = emr_train.prepare_model(model)
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
        train_loss = train_rows = 0.0
        order = torch.randperm(len(train[1]), generator=torch.Generator().manual_seed(seed + epoch))
        for inputs, y, _ in _batches(train, batch_size, device, order):
            optimizer.zero_grad()
            loss = loss_fn(model(*inputs), y)
            (loss / len(y)).backward()
            optimizer.step()
            train_loss += loss.item()
            train_rows += len(y)
        model.eval()
        test_sums = _sums(model, test, batch_size, device, loss_fn, extra_metrics)
        # train loss, train rows, then the test sums; on the device, as NCCL reduces no CPU tensors
        sums = torch.tensor([train_loss, train_rows, *test_sums], dtype=torch.float64, device=device)
        if distributed:
            dist.all_reduce(sums)
        totals = sums.tolist()
        seconds = time.monotonic() - started
        metrics = {
            "train_loss": totals[0] / max(totals[1], 1),
            **_test_metrics(totals[2:], extra_metrics),
            "train_rows": int(totals[1]),
            "rows_per_second": totals[1] / max(seconds, 1e-9),
            "start_epoch": start_epoch,  # > 0 when this attempt resumed from a checkpoint
        }
        emr_train.report_epoch(metrics, model=model, optimizer=optimizer, epoch=epoch)
