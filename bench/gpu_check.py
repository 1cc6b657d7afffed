"""GPU check: run the tabular Ray Train loop with ``ScalingConfig(num_workers=1, use_gpu=True)``.

Self-contained; meant for a single machine with one CUDA GPU (and Ray, torch, pandas installed)::

    python3 bench/gpu_check.py --out bench/results/gpu_check.json

It starts a local Ray node, builds a small synthetic binary-classification dataset with Ray Data, and
fits ``TorchTrainer(include.models.tabular.train_loop)`` on one GPU worker. A thin wrapper around the
loop asserts that ``ray.train.torch.get_device()`` is a CUDA device and returns (as the rank-0 return
value) what the worker saw; the driver then reads the checkpoint's tensors' storage locations to show
the weights were trained on the GPU.

Variants (each a separate ``fit``):

* ``default``: the loop as shipped, with Ray's default torch backend (NCCL when ``use_gpu=True``).
* ``cpu_gloo_cuda_nccl``: the same loop, with ``TorchConfig(backend="cpu:gloo,cuda:nccl")`` so that
  CPU tensors have a collective backend too (a config-only workaround).
* ``fixed_loop``: a copy of the loop whose metric accumulator lives on the training device (the
  candidate code fix), with the default backend.

By default the last two run only when ``default`` fails; ``--variants`` picks them explicitly.
``--cpu`` runs the same checks without a GPU (``use_gpu=False``), to test this script on a laptop.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile  # noqa: F401  (used by the exec'd fixed_train_loop)
import threading
import time
import traceback
from typing import Any

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from collections.abc import Callable  # noqa: E402,F401  (used by the exec'd fixed loop)

from include.models.tabular import build_model, train_loop  # noqa: E402

try:  # the loop's body lives in include.training.loop.run_epochs (older trees: in train_loop itself)
    from include.training import loop as _loop_module  # noqa: E402
    from include.training.loop import _batches  # noqa: E402,F401

    _LOOP_BODY = _loop_module.run_epochs
except ImportError:  # pragma: no cover
    from include.models.tabular import _batches  # noqa: E402,F401

    _LOOP_BODY = train_loop

FEATURES = [f"f{i:02d}" for i in range(16)]
LABEL = "label"
STORAGE = "/tmp/ray_results"
ACCUMULATOR = "sums = torch.zeros(5, dtype=torch.float64)"

RESULT: dict[str, Any] = {"status": "started", "variants": {}}
OUT_PATH = None


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def save() -> None:
    if OUT_PATH:
        os.makedirs(os.path.dirname(os.path.abspath(OUT_PATH)), exist_ok=True)
        with open(OUT_PATH, "w") as f:
            json.dump(RESULT, f, indent=2, default=str)


def _fixed_train_loop_source() -> str:
    """``train_loop``'s source with the accumulator moved onto the training device."""
    src = inspect.getsource(_LOOP_BODY)
    if src.count(ACCUMULATOR) != 1:
        raise RuntimeError(
            f"{_LOOP_BODY.__name__} no longer holds the expected accumulator line; update gpu_check.py"
        )
    src = src.replace(ACCUMULATOR, "sums = torch.zeros(5, dtype=torch.float64, device=device)")
    return src.replace(f"def {_LOOP_BODY.__name__}(", "def _fixed_body(", 1)


# Defined in this (``__main__``) module so cloudpickle ships it by value to the worker.
exec(compile(_fixed_train_loop_source(), "<fixed_loop>", "exec"), globals())


def fixed_train_loop(config: dict[str, Any]) -> None:
    """``train_loop`` with the metric accumulator on the training device."""
    if _LOOP_BODY is train_loop:
        return _fixed_body(config)  # noqa: F821
    return _fixed_body(config, build_model)  # noqa: F821


def checked_loop(config: dict[str, Any]):
    """Worker wrapper: check the device, run the real (or fixed) loop, return what the worker saw."""
    import torch
    import torch.distributed as dist
    from ray.train.torch import get_device

    expect_cuda = bool(config.get("_expect_cuda"))
    inner = fixed_train_loop if config.get("_inner") == "fixed" else train_loop
    loop_config = {k: v for k, v in config.items() if not k.startswith("_")}

    device = get_device()
    info: dict[str, Any] = {
        "device": str(device),
        "device_type": device.type,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "torch_cuda_available": torch.cuda.is_available(),
        "loop": inner.__name__,
    }
    if expect_cuda:
        assert device.type == "cuda", (
            f"ray.train.torch.get_device() returned {device}, expected a CUDA device"
        )
    if device.type == "cuda":
        info["gpu_name"] = torch.cuda.get_device_name(device)
        torch.cuda.reset_peak_memory_stats(device)
    started = time.monotonic()
    inner(loop_config)
    info["loop_seconds"] = round(time.monotonic() - started, 3)
    info["dist_initialized"] = dist.is_available() and dist.is_initialized()
    if info["dist_initialized"]:
        info["dist_backend"] = str(dist.get_backend())
        info["world_size"] = dist.get_world_size()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        info["max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return info


def make_frames(rows: int, test_rows: int, seed: int = 0):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    w = rng.normal(size=len(FEATURES))

    def frame(n: int):
        x = rng.normal(size=(n, len(FEATURES))).astype("float32")
        score = x @ w + 0.5 * np.sin(2.0 * x[:, 0]) + rng.normal(scale=0.5, size=n)
        df = pd.DataFrame(x, columns=FEATURES)
        df[LABEL] = (score > 0).astype("int64")
        return df

    return frame(rows), frame(test_rows)


def checkpoint_locations(checkpoint) -> list[str]:
    """Storage locations (e.g. 'cuda:0') of the tensors saved in the checkpoint's state.pt."""
    import torch

    locations: set[str] = set()

    def remember(storage, location):
        locations.add(location)
        return storage

    with checkpoint.as_directory() as d:
        torch.load(os.path.join(d, "state.pt"), map_location=remember)
    return sorted(locations)


def run_variant(name: str, ds, ds_test, use_gpu: bool, args) -> dict[str, Any]:
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    config = {
        "feature_columns": FEATURES,
        "label_column": LABEL,
        "epochs": args.epochs,
        "lr": 0.003,
        "batch_size": 512,
        "_expect_cuda": use_gpu,
        "_inner": "fixed" if name == "fixed_loop" else "real",
    }
    torch_config = TorchConfig(backend="cpu:gloo,cuda:nccl") if name == "cpu_gloo_cuda_nccl" else None
    run_name = "gpu_check" if name == "default" else f"gpu_check_{name}"
    out: dict[str, Any] = {
        "run_name": run_name,
        "torch_backend": "cpu:gloo,cuda:nccl" if torch_config else "default (nccl with use_gpu=True)",
        "loop": "include.models.tabular.train_loop"
        if config["_inner"] == "real"
        else f"copy of {_LOOP_BODY.__module__}.{_LOOP_BODY.__name__} with sums on the training device",
    }
    trainer = TorchTrainer(
        checked_loop,
        train_loop_config=config,
        torch_config=torch_config,
        scaling_config=ray.train.ScalingConfig(num_workers=1, use_gpu=use_gpu),
        run_config=ray.train.RunConfig(
            storage_path=STORAGE, name=run_name, failure_config=ray.train.FailureConfig(max_failures=0)
        ),
        datasets={"train": ds, "test": ds_test},
    )
    log(f"variant {name}: fit starts")
    started = time.monotonic()
    try:
        result = trainer.fit()
    except Exception as exc:  # TrainingFailedError and friends
        out["fit_seconds"] = round(time.monotonic() - started, 2)
        out["ok"] = False
        out["error_type"] = type(exc).__name__
        text = str(exc)
        out["error"] = text[-4000:]
        key = [ln.strip() for ln in text.splitlines() if "Error" in ln and ":" in ln]
        out["error_summary"] = (
            key[-1][:500] if key else text.strip().splitlines()[-1][:500] if text.strip() else ""
        )
        log(f"variant {name}: FAILED after {out['fit_seconds']} s: {out['error_summary']}")
        return out
    out["fit_seconds"] = round(time.monotonic() - started, 2)
    worker = result.return_value or {}
    out["worker"] = worker
    out["final_metrics"] = dict(result.metrics or {})
    out["epochs_reported"] = [m for _, m in (result.best_checkpoints or [])]
    if result.checkpoint is not None:
        try:
            out["checkpoint_tensor_locations"] = checkpoint_locations(result.checkpoint)
        except Exception as exc:
            out["checkpoint_tensor_locations_error"] = repr(exc)
    acc = out["final_metrics"].get("test_accuracy", 0.0)
    checks = {
        "device_as_expected": worker.get("device_type") == "cuda"
        if use_gpu
        else worker.get("device_type") == "cpu",
        "test_accuracy_gt_0_8": acc > 0.8,
        "epochs_completed": out["final_metrics"].get("epoch") == args.epochs - 1,
    }
    if use_gpu:
        checks["checkpoint_on_cuda"] = any(
            loc.startswith("cuda") for loc in out.get("checkpoint_tensor_locations", [])
        )
    out["checks"] = checks
    out["ok"] = all(checks.values())
    log(f"variant {name}: ok={out['ok']} fit {out['fit_seconds']} s, metrics {out['final_metrics']}")
    return out


def torch_facts() -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count(),
        "nccl_available": bool(getattr(torch.distributed, "is_nccl_available", lambda: False)()),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(
            gpu_name=props.name,
            capability=f"{props.major}.{props.minor}",
            total_memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
        )
        try:
            facts["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
    if shutil.which("nvidia-smi"):
        try:
            facts["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.strip()
        except Exception as exc:
            facts["nvidia_smi"] = repr(exc)
    return facts


def watchdog(deadline_s: float) -> None:
    def fire():
        RESULT["status"] = f"timed out after {deadline_s} s (watchdog)"
        save()
        log(RESULT["status"])
        print(json.dumps(RESULT, indent=2, default=str), flush=True)
        os._exit(3)

    t = threading.Timer(deadline_s, fire)
    t.daemon = True
    t.start()


def main() -> int:
    global OUT_PATH
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(REPO_ROOT, "bench", "results", "gpu_check.json"))
    p.add_argument("--cpu", action="store_true", help="no GPU: use_gpu=False (to test the script)")
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--test-rows", type=int, default=5000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument(
        "--variants",
        default="auto",
        help="comma list of default,cpu_gloo_cuda_nccl,fixed_loop; 'auto' runs the last two "
        "only if default fails",
    )
    p.add_argument(
        "--deadline", type=float, default=360.0, help="give up (and write what we have) after this"
    )
    args = p.parse_args()
    OUT_PATH = args.out
    use_gpu = not args.cpu
    watchdog(args.deadline)
    t0 = time.monotonic()

    RESULT["config"] = {
        "rows": args.rows,
        "test_rows": args.test_rows,
        "features": len(FEATURES),
        "epochs": args.epochs,
        "lr": 0.003,
        "batch_size": 512,
        "scaling_config": {"num_workers": 1, "use_gpu": use_gpu},
    }
    RESULT["torch"] = torch_facts()
    log(f"torch facts: {RESULT['torch']}")
    save()
    if use_gpu and not RESULT["torch"]["cuda_available"]:
        RESULT["status"] = "no CUDA device visible to torch"
        save()
        print(json.dumps(RESULT, indent=2, default=str))
        return 2

    import ray
    import ray.data

    RESULT["ray"] = ray.__version__
    t = time.monotonic()
    init_kwargs: dict[str, Any] = dict(
        num_cpus=4, num_gpus=1 if use_gpu else 0, include_dashboard=False, object_store_memory=1 << 30
    )
    try:
        ray.init(**init_kwargs)
    except Exception as exc:
        log(f"ray.init failed ({exc!r}); retrying on 127.0.0.1")
        ray.shutdown()
        init_kwargs["_node_ip_address"] = "127.0.0.1"
        ray.init(**init_kwargs)
    RESULT["ray_init_seconds"] = round(time.monotonic() - t, 2)
    RESULT["ray_cluster_resources"] = ray.cluster_resources()
    log(f"ray {ray.__version__} up in {RESULT['ray_init_seconds']} s: {RESULT['ray_cluster_resources']}")
    ray.data.DataContext.get_current().enable_progress_bars = False
    shutil.rmtree(STORAGE, ignore_errors=True)

    train_df, test_df = make_frames(args.rows, args.test_rows)
    ds, ds_test = ray.data.from_pandas(train_df), ray.data.from_pandas(test_df)
    RESULT["label_mean"] = round(float(train_df[LABEL].mean()), 4)

    names = (
        ["default"] if args.variants == "auto" else [v.strip() for v in args.variants.split(",") if v.strip()]
    )
    for name in names:
        try:
            RESULT["variants"][name] = run_variant(name, ds, ds_test, use_gpu, args)
        except Exception:
            RESULT["variants"][name] = {"ok": False, "error": traceback.format_exc()[-4000:]}
        save()
        if args.variants == "auto" and name == "default" and not RESULT["variants"][name]["ok"]:
            for extra in ("cpu_gloo_cuda_nccl", "fixed_loop"):
                try:
                    RESULT["variants"][extra] = run_variant(extra, ds, ds_test, use_gpu, args)
                except Exception:
                    RESULT["variants"][extra] = {"ok": False, "error": traceback.format_exc()[-4000:]}
                save()

    default = RESULT["variants"].get("default", {})
    RESULT["shipped_loop_trains_on_gpu" if use_gpu else "shipped_loop_trains_on_cpu"] = bool(
        default.get("ok")
    )
    RESULT["total_seconds"] = round(time.monotonic() - t0, 2)
    RESULT["status"] = "done"
    save()
    ray.shutdown()
    print(json.dumps(RESULT, indent=2, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
