"""Benchmark: training samples/s of the tabular MLP, plain PyTorch vs the TorchTrainer job path.

The same model (``include.models.tabular.build_model``), loss, optimizer, batch size and data
(``--rows`` synthetic rows, 90% train / 10% test, standardized float32) for:

* ``a``: plain single-process PyTorch on tensors in memory (minibatches by slicing, the same
  per-epoch train + test evaluation as the Ray loop), with torch's default thread count and with 1
  thread (a Ray Train worker with 1 CPU gets ``OMP_NUM_THREADS=1``); ``a_loader`` is the seed
  article's ``DataLoader(TensorDataset)``.
* ``b`` / ``c``: ``include.models.tabular.train_loop`` under ``ray.train.torch.TorchTrainer`` with 1 and
  2 workers, fed as ``emr_ray.cluster.jobs.train`` feeds it: each worker reads its own rows of the Parquet
  files with pyarrow (``emr_ray.cluster.jobs.shards``), checkpoint every epoch under ``.state/bench/train_runs``.
  (Earlier runs with the Ray Data feed this replaced are in ``bench/results/SUMMARY.md``.)

Reported apart: ``ray.init`` (cluster start), materializing the data, and the fixed overhead of
each ``fit()``: time from the ``fit()`` call to the first reported epoch minus that epoch's own
time (worker group start, then loop set-up: model, process group, dataset shard or own read),
how much longer the first epoch took than a steady one, and from the last report to ``fit()``'s
return. Steady-state samples/s uses the epochs after the first. Figures are wall-clock on a
shared, loaded 2-core machine: each carries the 1-minute load average at the time.

Run inside the loopback-only namespace::

    bash scripts/loopback.sh .venv/bin/python -m bench.training --rows 200000 --epochs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from bench._common import (
    FEATURE_COLUMNS,
    LABEL_COLUMN,
    STATE,
    footer_rows,
    init_ray,
    machine,
    per_second,
    rate,
    read_shard,
    setup_env,
    shard_plan,
    table,
    write_dataset,
    write_json,
)

VARIANTS = ("a", "a_loader", "b", "c", "b_sync")
RAY_VARIANTS = {"b": 1, "c": 2, "b_sync": 1}  # variant: Ray Train workers
#: the variants that report as the loop did before issue 35: the checkpoint uploaded and the report
#: handed to the controller within ``report()`` (Ray Train's SYNC mode), the next epoch waiting
SYNC_REPORT = {"b_sync"}


def _steady(epochs: list[dict[str, Any]]) -> float | None:
    """Train rows per second over the epochs after the first (all of them if there is only one)."""
    later = epochs[1:] or epochs
    seconds = sum(e["seconds"] for e in later)
    return sum(e["train_rows"] for e in later) / seconds if seconds else None


def plain_torch(data, config: dict[str, Any], *, threads: int | None, loader: bool) -> dict[str, Any]:
    """The loop of ``tabular.train_loop`` without Ray: same model, loss, optimizer and batches."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from include.models.tabular import build_model

    (x, y), (xt, yt) = data
    default_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        torch.manual_seed(int(config["seed"]))
        model = build_model(config)
        optimizer = torch.optim.Adam(model.parameters(), lr=float(config["lr"]))
        loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
        bs = int(config["batch_size"])

        def batches(features, labels):
            if loader:  # the seed article's way: per-sample indexing + collate
                yield from DataLoader(TensorDataset(features, labels), batch_size=bs, shuffle=False)
            else:
                for i in range(0, len(labels), bs):
                    yield features[i : i + bs], labels[i : i + bs]

        epochs = []
        for epoch in range(int(config["epochs"])):
            started = time.perf_counter()
            model.train()
            rows = 0
            for xb, yb in batches(x, y):
                optimizer.zero_grad()
                loss = loss_fn(model(xb), yb)
                (loss / len(yb)).backward()
                optimizer.step()
                rows += len(yb)
            model.eval()
            correct = 0
            with torch.no_grad():
                for xb, yb in batches(xt, yt):
                    correct += (model(xb).argmax(dim=1) == yb).sum().item()
            seconds = time.perf_counter() - started
            epochs.append(
                {
                    "epoch": epoch,
                    "seconds": round(seconds, 3),
                    "train_rows": rows,
                    "rows_per_second": rows / seconds,
                    "test_accuracy": correct / len(yt),
                    "load1": round(os.getloadavg()[0], 2),
                }
            )
        return {
            "threads": torch.get_num_threads(),
            "epochs": epochs,
            "steady_rows_per_s": _steady(epochs),
            "test_accuracy": epochs[-1]["test_accuracy"],
        }
    finally:
        torch.set_num_threads(default_threads)


def _recorder(path: str):
    """A Ray Train callback (runs in the controller) that appends each report's time and metrics."""
    from ray.train import UserCallback

    class Recorder(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            import json
            import os
            import time

            with open(path, "a") as f:
                f.write(
                    json.dumps({"t": time.time(), "load1": os.getloadavg()[0], "metrics": metrics[0]}) + "\n"
                )

    return Recorder()


def timed_loop(config: dict[str, Any]) -> None:
    """The worker function: the chosen loop, with worker-side timestamps added to each report.

    Ray Train's controller sees reports only when it polls its workers (every 2 s by default,
    ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``), so times taken in a callback are rounded up to that.
    Here ``ray.train.report`` is wrapped in this worker process to add when the worker entered its
    function and when it called report; the loop itself is unchanged.
    """
    import time

    import ray.train

    entered = time.time()
    original = ray.train.report
    sync = config.pop("_bench_sync_report", False)

    def report(metrics, *args, **kwargs):
        stamps = {"worker_entered_at": entered, "worker_reported_at": time.time()}
        if sync:
            kwargs["checkpoint_upload_mode"] = ray.train.CheckpointUploadMode.SYNC
        return original({**metrics, **stamps}, *args, **kwargs)

    ray.train.report = report
    from include.models.tabular import train_loop

    train_loop(config)


def ray_train(config: dict[str, Any], workers: int, tag: str) -> dict[str, Any]:
    """One ``TorchTrainer.fit()`` of the job's loop and feed."""
    import ray.train
    from ray.train.torch import TorchTrainer

    name = f"bench-{tag}-{workers}w-{int(time.time())}"
    record = STATE / "train_runs" / f"{name}.jsonl"
    record.parent.mkdir(parents=True, exist_ok=True)
    trainer = TorchTrainer(
        timed_loop,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=False),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=str(STATE / "train_runs"),
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="test_loss", checkpoint_score_order="min"
            ),
            callbacks=[_recorder(str(record))],
        ),
    )
    fit_started = time.time()
    result = trainer.fit()
    fit_ended = time.time()
    if result.error:
        raise result.error
    reports = [json.loads(line) for line in record.read_text().splitlines()]
    epochs = []
    for rep in reports:
        m = rep["metrics"]
        epochs.append(
            {
                "epoch": m["epoch"],
                # rank 0's epoch time (train + test + all-reduce); train_rows is all workers' total
                "seconds": round(m["train_rows"] / m["rows_per_second"], 3),
                "train_rows": m["train_rows"],
                "rows_per_second": m["rows_per_second"],
                "test_accuracy": m["test_accuracy"],
                "reported_at": round(m["worker_reported_at"] - fit_started, 3),  # rank 0, before report()
                "seen_by_controller_at": round(rep["t"] - fit_started, 3),
                "load1": round(rep["load1"], 2),
            }
        )
    first, last = epochs[0], epochs[-1]
    entered = reports[0]["metrics"]["worker_entered_at"] - fit_started
    between = last["reported_at"] - first["reported_at"]
    later_rows = sum(e["train_rows"] for e in epochs[1:])
    steady = _steady(epochs)
    return {
        "workers": workers,
        "run_name": name,
        "fit_s": round(fit_ended - fit_started, 3),
        # fit() -> first epoch starting, split in: worker group up (fit() -> rank 0 enters its
        # function) and loop set-up (model, prepare_model, dataset shard or own read)
        "startup_overhead_s": round(first["reported_at"] - first["seconds"], 3),
        "worker_group_start_s": round(entered, 3),
        "loop_setup_s": round(first["reported_at"] - first["seconds"] - entered, 3),
        # how much longer the first epoch took than a steady one (the data iterator warming up)
        "first_epoch_excess_s": round(first["seconds"] - first["train_rows"] / steady, 3) if steady else None,
        # last report call -> fit() returns (report, controller poll, shutdown)
        "teardown_s": round(fit_ended - fit_started - last["reported_at"], 3),
        "epochs": epochs,
        "steady_rows_per_s": steady,
        # counting each epoch's checkpoint write and report between epochs
        "steady_rows_per_s_report_to_report": later_rows / between if between > 0 else None,
        "report_gap_s": round(
            between / (len(epochs) - 1) - statistics.mean(e["seconds"] for e in epochs[1:]), 3
        )
        if len(epochs) > 1
        else None,
        "test_accuracy": last["test_accuracy"],
    }


def report(result: dict[str, Any]) -> str:
    v = result["variants"]
    head = (
        f"training: {result['train_rows']:,} train + {result['test_rows']:,} test rows, "
        f"{result['config']['epochs']} epochs, batch {result['config']['batch_size']}, MLP hidden "
        f"{result['config']['hidden']}; load average at start {result['machine']['loadavg_at_start']}"
    )
    rows = []
    plain = v.get("a", [])
    # the reference (a): the fastest plain-PyTorch run of this benchmark (both thread counts, before
    # and after the Ray runs), so that one run slowed by the machine's load does not flatter Ray
    reference = max((r["steady_rows_per_s"] for r in plain), default=None)

    def add(label: str, r: dict[str, Any], overhead: str = "-") -> None:
        epoch_rates = ", ".join(rate(e["train_rows"], e["seconds"]) for e in r["epochs"])
        loads = ", ".join(str(e["load1"]) for e in r["epochs"])
        steady = r["steady_rows_per_s"]
        ratio = steady / reference if reference and steady else None
        rows.append(
            [
                label,
                per_second(steady),
                f"{ratio:.2f}x" if ratio else "-",
                epoch_rates,
                overhead,
                f"{r['test_accuracy']:.3f}",
                loads,
            ]
        )

    for key, label in (("a", "(a) plain PyTorch"), ("a_loader", "(a) DataLoader(TensorDataset)")):
        for r in v.get(key, []):
            add(f"{label}, {r['threads']} thread(s), {r.get('when', 'before Ray')}", r)
    for key, label in (
        ("b", "(b) TorchTrainer job path, 1 worker"),
        ("c", "(c) TorchTrainer job path, 2 workers"),
    ):
        for r in v.get(key, []):
            add(
                label,
                r,
                f"{r['startup_overhead_s']:.1f} + {r['first_epoch_excess_s'] or 0:.1f} + {r['teardown_s']:.1f}",
            )
    text = [head, ""]
    text.append(
        table(
            [
                "variant",
                "steady rows/s",
                "vs (a)",
                "per-epoch rows/s",
                "fit overhead s (start + 1st-epoch excess + end)",
                "test acc",
                "load1 per epoch",
            ],
            rows,
        )
    )
    text += [
        "",
        f"- ray.init {result.get('ray_init_s', '-')} s",
    ]
    for key in RAY_VARIANTS:
        for r in v.get(key, []):
            rr = r["steady_rows_per_s_report_to_report"]
            text.append(
                f"- {key} ({r['workers']} worker(s)): fit() {r['fit_s']:.1f} s in all; start-up "
                f"{r['startup_overhead_s']:.1f} s = worker group {r['worker_group_start_s']:.1f} s + loop set-up "
                f"{r['loop_setup_s']:.1f} s; checkpoint + report between epochs {r['report_gap_s']:.2f} s, "
                f"so {per_second(rr)} rows/s counting it"
            )
    if reference:
        a = reference
        text += [
            "",
            f"Issue 5 targets: (b) >= 0.8x (a) in steady state, (a) = the fastest plain run above "
            f"({per_second(a)} rows/s); start-up < 15 s on a running cluster:",
        ]
        for one, two, feed in (("b", "c", "job path (per-worker pyarrow shards)"),):
            if one not in v:
                continue
            b = statistics.median(r["steady_rows_per_s"] for r in v[one])
            over = statistics.median(r["startup_overhead_s"] for r in v[one] + v.get(two, []))
            line = (
                f"- {feed}: 1 worker {b / a:.2f}x of (a) ({'met' if b / a >= 0.8 else 'not met'})"
                + f"; start-up median {over:.1f} s ({'met' if over < 15 else 'not met'})"
            )
            if two in v:
                c = statistics.median(r["steady_rows_per_s"] for r in v[two])
                line += f"; 2 workers / 1 worker = {c / b:.2f}x on 2 cores"
            text.append(line)
        counted = {key: statistics.median(r["steady_rows_per_s_report_to_report"] or 0 for r in v[key])
                   for key in ("b", "b_sync") if key in v}  # fmt: skip
        if counted:
            text.append(
                "Issue 35 target: epochs counting their checkpoint and report >= 0.8x (a): "
                + "; ".join(
                    f"{key} {rows / a:.2f}x ({per_second(rows)} rows/s)" for key, rows in counted.items()
                )
                + (
                    f"; background (b) / in-step (b_sync) {counted['b'] / counted['b_sync']:.2f}x"
                    if len(counted) == 2 and counted["b_sync"]
                    else ""
                )  # fmt: skip
            )
    return "\n".join(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000, help="train + test rows (10%% test)")
    parser.add_argument(
        "--epochs", type=int, default=3, help="at least 2: steady state uses epochs after the first"
    )
    parser.add_argument("--batch-size", type=int, default=256, help="the tabular DAG's default")
    parser.add_argument("--repeat", type=int, default=1, help="fits per Ray Train variant")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    args = parser.parse_args(argv)
    chosen = [p.strip() for p in args.variants.split(",") if p.strip()]
    if set(chosen) - set(VARIANTS):
        parser.error(f"unknown variant(s) {sorted(set(chosen) - set(VARIANTS))}; choose from {VARIANTS}")
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (steady state uses the epochs after the first)")

    setup_env()  # before anything imports ray: Ray reads RAY_AUTH_MODE at import
    started = time.perf_counter()
    test_rows = args.rows // 10
    train_files = write_dataset(args.rows - test_rows, f"train-{args.rows}", seed="bench-train")
    test_files = write_dataset(test_rows, f"test-{args.rows}", files=2, seed="bench-test")
    config = {
        "feature_columns": FEATURE_COLUMNS,
        "label_column": LABEL_COLUMN,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": 0.003,
        "hidden": 64,
        "seed": 42,
    }
    result: dict[str, Any] = {
        "rows": args.rows,
        "train_rows": args.rows - test_rows,
        "test_rows": test_rows,
        "config": config,
        "variants": {},
    }
    v = result["variants"]
    import ray

    result["machine"] = machine()
    data = (read_shard(train_files), read_shard(test_files))
    if "a" in chosen:
        v["a"] = [plain_torch(data, config, threads=t, loader=False) for t in (None, 1)]
        print(f"a done: {max(r['steady_rows_per_s'] for r in v['a']):.0f} rows/s", flush=True)
    if "a_loader" in chosen:
        v["a_loader"] = [plain_torch(data, config, threads=None, loader=True)]
        print(f"a_loader done: {v['a_loader'][0]['steady_rows_per_s']:.0f} rows/s", flush=True)
    if set(chosen) & set(RAY_VARIANTS):
        result["ray_init_s"] = round(init_ray(num_cpus=2), 2)
        try:
            from emr_ray.cluster.jobs import shards

            plan = shard_plan({"train": footer_rows(train_files), "test": footer_rows(test_files)})
            for key, workers in RAY_VARIANTS.items():
                if key not in chosen:
                    continue
                run_config = config | {shards.PLAN_KEY: plan, "_bench_sync_report": key in SYNC_REPORT}
                v[key] = [ray_train(run_config, workers, key) for _ in range(args.repeat)]
                print(f"{key} done: {v[key][0]['steady_rows_per_s']:.0f} rows/s", flush=True)
        finally:
            ray.shutdown()
    if "a" in chosen and set(chosen) & set(RAY_VARIANTS):  # (a) again, to bracket the load drift
        v["a"] += [
            plain_torch(data, config, threads=t, loader=False) | {"when": "after Ray"} for t in (None, 1)
        ]
    del data
    result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["total_s"] = round(time.perf_counter() - started, 1)
    text = report(result)
    result["table"] = text
    path = write_json(f"training-{args.rows}.json", result)
    print(text)
    print(f"\nwritten {path} in {result['total_s']} s total")


if __name__ == "__main__":
    main()
