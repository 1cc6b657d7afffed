"""Job: reinforcement learning with RLlib on a Gymnasium environment, tracked in MLflow.

The algorithm trains in iterations (RLlib's ``Algorithm.train()``) in this job's driver: its
learner runs here, and so does its sampler unless ``num_env_runners`` asks for EnvRunner actors
on the cluster. After every ``checkpoint_every`` iterations the whole algorithm is saved under
``<storage_path>/<run_name>/checkpoint_<iteration>`` through the provider's pyarrow filesystem
(``file://``, ``cos://``, ``hdfs://``), and the run's state file names that checkpoint: a retry of
an unfinished run restores it and continues from its iteration, into the same MLflow run; a rerun
of a finished run with the same spec returns the stored result; another spec starts clean
(the same rules as :mod:`emr_ray.cluster.jobs.train`, whose :class:`RunState` this job shares).

Each iteration's metrics reach MLflow exactly once, with the iteration as step: they are logged
only after the checkpoint that covers them is saved (an iteration a stopped attempt did not
checkpoint is trained again, so it must not have been logged), and a resumed run logs what its
last checkpoint covered but MLflow had not received yet.

The policy is logged as an MLflow pyfunc model (``model``): a batch of observations in, the
greedy actions out, with an observation input example. The same object plays
``evaluation_episodes`` greedy episodes after training (``eval_episode_return_mean``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Any

from emr_ray.cluster import mlflow_auth, storage
from emr_ray.cluster.jobs import train_mlflow as tracking
from emr_ray.cluster.jobs._runtime import JobInputError, main
from emr_ray.cluster.jobs.train import RunState, resume_state
from emr_ray.cluster.results import RLlibResult
from emr_ray.cluster.reuse import FORCE_ENV
from emr_ray.cluster.spec import RLlibJobSpec

log = logging.getLogger("emr_ray.cluster.jobs.rllib")
CHECKPOINT_PREFIX = "checkpoint_"
MODEL_NAME = "model"
#: the env runners' metrics logged each iteration (episode_return_mean: the register gate's metric)
ENV_RUNNER_METRICS = (
    "episode_return_mean",
    "episode_return_min",
    "episode_return_max",
    "episode_len_mean",
    "num_episodes",
    "num_env_steps_sampled_lifetime",
)
#: the learners' metrics besides every ``*loss``
LEARNER_METRICS = ("entropy", "vf_explained_var", "mean_kl_loss", "curr_kl_coeff")
#: a metric every iteration logs: its MLflow history says which iterations were logged
STEP_METRIC = "time_this_iter_s"


def fingerprint(spec: RLlibJobSpec) -> str:
    """What makes two trainings the same (:meth:`RLlibJobSpec.fingerprint_payload`)."""
    payload = json.dumps(spec.fingerprint_payload(), sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


# -- step 1: check and configure ---------------------------------------------------------------------
def check_env(spec: RLlibJobSpec) -> None:
    """The environment id names a registered Gymnasium environment (before any cluster work)."""
    import gymnasium

    try:
        gymnasium.spec(spec.env)
    except gymnasium.error.Error as e:
        raise JobInputError(
            f"env={spec.env!r} is not a registered Gymnasium environment ({e}). Use an id from "
            "gymnasium.registry, e.g. 'CartPole-v1', or register yours in a module the job imports."
        ) from e


def build_config(spec: RLlibJobSpec):
    """The RLlib ``AlgorithmConfig`` (new API stack) from the spec; a bad hyperparameter fails here."""
    from ray.rllib.algorithms.registry import ALGORITHMS

    algo_config = ALGORITHMS[spec.algorithm]()[1]
    algo_config = algo_config.environment(spec.env, env_config=dict(spec.env_config)).env_runners(
        num_env_runners=int(spec.num_env_runners), num_envs_per_env_runner=int(spec.num_envs_per_env_runner)
    )
    try:
        algo_config = algo_config.training(**spec.config)
    except TypeError as e:
        raise JobInputError(
            f"config of {spec.algorithm} has a key its training() does not take ({e}); use "
            f"{type(algo_config).__name__}.training() keywords, e.g. lr, gamma, train_batch_size_per_learner."
        ) from e
    if spec.model_config:
        algo_config = algo_config.rl_module(model_config=dict(spec.model_config))
    if spec.seed is not None:
        algo_config = algo_config.debugging(seed=int(spec.seed))
    return algo_config


def build_algorithm(algo_config):
    """Build the algorithm. RLlib's base class (a Tune Trainable) always makes an empty log folder
    under ``~/ray_results``; :func:`stop_algorithm` removes it again."""
    try:
        return algo_config.build_algo()
    except (TypeError, ValueError, KeyError) as e:
        raise JobInputError(f"RLlib refused the algorithm's config ({type(e).__name__}: {e}); fix it.") from e


def stop_algorithm(algo) -> None:
    logdir = getattr(algo, "logdir", None)
    algo.stop()
    if logdir and os.path.isdir(logdir) and not os.listdir(logdir):
        os.rmdir(logdir)


# -- step 2: resume state ----------------------------------------------------------------------------
def start_run(spec: RLlibJobSpec, resume_run_id: str | None) -> str:
    """The MLflow run: the stored one when resuming, else a new one with the spec's params."""
    settings = spec.mlflow
    with tracking.refused_as_input_error(spec):  # the training job's login handling
        client = tracking.client(spec)
        if resume_run_id:
            client.update_run(resume_run_id, status="RUNNING")
            log.info("Resuming MLflow run %s", resume_run_id)
            return resume_run_id
        experiment = client.get_experiment_by_name(settings.experiment_name)
        experiment_id = (
            experiment.experiment_id
            if experiment
            else client.create_experiment(
                settings.experiment_name, artifact_location=settings.artifact_location
            )
        )
        tags = {**settings.tags, "emr_ray.run_name": spec.run_name}
        run = client.create_run(experiment_id, run_name=spec.run_name, tags=tags)
        params = {k: v for k, v in spec.fingerprint_payload().items() if k not in ("config", "model_config")}
        params |= {f"config.{k}": v for k, v in spec.config.items()}
        params |= {f"model.{k}": v for k, v in spec.model_config.items()}
        for key, value in params.items():
            client.log_param(run.info.run_id, key, str(value)[:6000])
        return run.info.run_id


# -- step 3: train, checkpoint, log ------------------------------------------------------------------
def iteration_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The finite numbers worth a curve from one ``Algorithm.train()`` result."""
    metrics: dict[str, Any] = {key: result.get("env_runners", {}).get(key) for key in ENV_RUNNER_METRICS}
    metrics[STEP_METRIC] = result.get(STEP_METRIC)
    for module_id, stats in (result.get("learners") or {}).items():
        if module_id == "__all_modules__" or not isinstance(stats, dict):
            continue
        prefix = "" if module_id == "default_policy" else f"{module_id}."
        for key, value in stats.items():
            if key.endswith("loss") or key in LEARNER_METRICS:
                metrics[f"{prefix}{key}"] = value
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def describe(metrics: dict[str, float]) -> str:
    shown = ("episode_return_mean", "episode_len_mean", "total_loss", "entropy", STEP_METRIC)
    return " ".join(f"{k}={metrics[k]:.4g}" for k in shown if k in metrics)


def checkpoint_name(iteration: int) -> str:
    return f"{CHECKPOINT_PREFIX}{iteration:06d}"


def save_checkpoint(algo, run_state: RunState, iteration: int) -> str:
    """Save the whole algorithm as ``checkpoint_<iteration>`` (the state file names it once it is whole)."""
    name = checkpoint_name(iteration)
    algo.save_to_path(f"{run_state.path}/{name}", filesystem=run_state.fsys)
    return name


def prune_checkpoints(run_state: RunState, num_to_keep: int) -> None:
    """Keep the newest ``num_to_keep`` checkpoints (the state file names the newest)."""
    from pyarrow import fs as pafs

    infos = run_state.fsys.get_file_info(pafs.FileSelector(run_state.path, allow_not_found=True))
    names = sorted(
        i.base_name
        for i in infos
        if i.type == pafs.FileType.Directory and i.base_name.startswith(CHECKPOINT_PREFIX)
    )
    for name in names[:-num_to_keep]:
        run_state.fsys.delete_dir(f"{run_state.path}/{name}")


def log_iterations(client, mlflow_run_id: str, logged: dict[int, dict[str, float]]) -> None:
    """One MLflow batch for the iterations a checkpoint now covers, each at its iteration as step."""
    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    batch = [Metric(k, v, stamp, it) for it, metrics in sorted(logged.items()) for k, v in metrics.items()]
    for start in range(0, len(batch), 1000):  # MLflow's limit per batch
        client.log_batch(mlflow_run_id, metrics=batch[start : start + 1000])


def backfill(client, mlflow_run_id: str, state: dict[str, Any]) -> None:
    """Log the iterations the last checkpoint covers that a stopped attempt had no time to send."""
    covered = {int(k): v for k, v in (state.get("unlogged") or {}).items()}
    if not covered:
        return
    logged = {m.step for m in client.get_metric_history(mlflow_run_id, STEP_METRIC)}
    missing = {it: metrics for it, metrics in covered.items() if it not in logged}
    if missing:
        log_iterations(client, mlflow_run_id, missing)
        log.info("Backfilled MLflow metrics of checkpointed iteration(s) %s", sorted(missing))


def train(spec: RLlibJobSpec, algo, run_state: RunState, state: dict[str, Any], client) -> dict[str, Any]:
    """Train from the restored iteration to ``spec.iterations``; return the state of the last checkpoint."""
    mlflow_run_id = state["mlflow_run_id"]
    pending: dict[int, dict[str, float]] = {}
    for iteration in range(int(algo.iteration) + 1, spec.iterations + 1):
        metrics = iteration_metrics(algo.train())
        print(f"[emr_ray] iteration {iteration}/{spec.iterations} {describe(metrics)}", flush=True)
        pending[iteration] = metrics
        if iteration % spec.checkpoint_every and iteration != spec.iterations:
            continue
        name = save_checkpoint(algo, run_state, iteration)
        state = state | {"checkpoint": name, "iteration": iteration, "metrics": metrics, "unlogged": pending}
        run_state.write(state)  # the retry's starting point, and what it must log if this attempt cannot
        prune_checkpoints(run_state, spec.num_to_keep)
        log_iterations(client, mlflow_run_id, pending)
        pending = {}
    return state


# -- step 4: the policy ------------------------------------------------------------------------------
class GreedyPolicy:
    """An MLflow pyfunc model (``mlflow.pyfunc.PythonModel``'s interface): observations in, the
    RLModule's greedy actions out. Its artifact is the RLModule checkpoint (``rl_module``); it
    needs ``ray[rllib]`` and ``torch`` where it is loaded, not this package (it is pickled by value)."""

    def __init__(self) -> None:
        self.module: Any = None

    def load_context(self, context) -> None:
        self.load(context.artifacts["rl_module"])

    def load(self, path: str) -> None:
        from ray.rllib.core.rl_module.rl_module import RLModule

        self.module = RLModule.from_checkpoint(path)
        self.module.eval()

    def predict(self, context, model_input, params=None):
        import numpy as np
        import torch

        obs = torch.as_tensor(np.asarray(model_input, dtype=np.float32))
        with torch.no_grad():
            out = self.module.forward_inference({"obs": obs})
            if "actions" in out:
                actions = out["actions"]
            else:
                dist = self.module.get_inference_action_dist_cls().from_logits(out["action_dist_inputs"])
                actions = dist.to_deterministic().sample()
        return actions.cpu().numpy()


def play(policy: GreedyPolicy, spec: RLlibJobSpec, episodes: int) -> list[float]:
    """Returns of ``episodes`` greedy episodes of the spec's environment (seeded: comparable runs)."""
    import gymnasium
    import numpy as np

    env = gymnasium.make(spec.env, **spec.env_config)
    returns = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=10_000 + episode)
            total, done = 0.0, False
            while not done:
                action = policy.predict(None, np.asarray([obs]))[0]
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return returns


def observation_example(spec: RLlibJobSpec, rows: int = 3):
    """First observations of a few seeded episodes: the logged model's input example."""
    import gymnasium
    import numpy as np

    env = gymnasium.make(spec.env, **spec.env_config)
    try:
        return np.stack([np.asarray(env.reset(seed=seed)[0], dtype=np.float32) for seed in range(rows)])
    finally:
        env.close()


@contextmanager
def _pickled_by_value(cls: type):
    """Pickle ``cls`` by value, so that the logged model loads without emr_ray installed."""
    import cloudpickle

    module = sys.modules[cls.__module__]
    if cls.__module__ == "__main__":  # run as ``python -m``: cloudpickle pickles by value already
        yield
        return
    cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        cloudpickle.unregister_pickle_by_value(module)


def log_policy(spec: RLlibJobSpec, algo, mlflow_run_id: str, client) -> dict[str, float]:
    """Log the greedy policy as the run's ``model`` and score it on greedy episodes."""
    import gymnasium
    import mlflow
    import ray
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        module_dir = os.path.join(tmp, "rl_module")
        algo.get_module().save_to_path(module_dir)
        policy = GreedyPolicy()
        policy.load(module_dir)
        scores: dict[str, float] = {}
        if spec.evaluation_episodes:
            returns = play(policy, spec, spec.evaluation_episodes)
            scores = {
                "eval_episode_return_mean": sum(returns) / len(returns),
                "eval_episode_return_min": min(returns),
            }
            print(f"[emr_ray] greedy policy over {len(returns)} episodes: returns {returns}", flush=True)
        tracking.ensure_credentials()
        mlflow.set_tracking_uri(spec.mlflow.tracking_uri)
        with mlflow.start_run(run_id=mlflow_run_id), _pickled_by_value(GreedyPolicy):
            mlflow.pyfunc.log_model(
                name=MODEL_NAME,
                python_model=_as_python_model(policy),
                artifacts={"rl_module": module_dir},
                input_example=observation_example(spec),
                pip_requirements=[
                    f"ray[rllib]=={ray.__version__}",
                    f"torch=={torch.__version__.split('+')[0]}",
                    f"gymnasium=={gymnasium.__version__}",
                    "numpy",
                ],
            )
    for key, value in scores.items():
        client.log_metric(mlflow_run_id, key, value)
    return scores


def _as_python_model(policy: GreedyPolicy):
    """The policy as an ``mlflow.pyfunc.PythonModel`` (a subclass made here: mlflow is imported late)."""
    import mlflow

    python_model: Any = mlflow.pyfunc.PythonModel

    class RLlibGreedyPolicy(GreedyPolicy, python_model):
        pass

    return RLlibGreedyPolicy()


# -- step 5: result ----------------------------------------------------------------------------------
def result_of(
    spec: RLlibJobSpec,
    run_state: RunState,
    state: dict[str, Any],
    start_iteration: int,
    seconds: float,
    scores: dict[str, float] | None = None,
) -> RLlibResult:
    """The job's JSON result (the operator's XCom)."""
    scheme, _ = storage.split_uri(spec.storage_path)
    path = f"{run_state.path}/{state['checkpoint']}"
    checkpoint_uri = f"file://{path}" if scheme == "file" else f"{scheme}://{path.lstrip('/')}"
    return RLlibResult(
        mlflow_run_id=state["mlflow_run_id"],
        tracking_uri=mlflow_auth.redact_uri(spec.mlflow.tracking_uri),
        run_name=spec.run_name,
        algorithm=spec.algorithm,
        env=spec.env,
        checkpoint_uri=checkpoint_uri,
        final_metrics=dict(state.get("metrics") or {}) | (scores or {}),
        iterations_completed=int(state["iteration"]),
        start_iteration=start_iteration,
        train_seconds=round(seconds, 2),
    )


def run(spec: RLlibJobSpec) -> RLlibResult:
    import ray
    import torch

    check_env(spec)
    algo_config = build_config(spec)
    options = spec.storage.options()
    print_key = fingerprint(spec)
    run_state = RunState(*storage.resolve(spec.run_uri, options))
    state = resume_state(spec, run_state, print_key, force=os.environ.get(FORCE_ENV) == "1")
    if stored := RLlibResult.read(state.get("result")):
        log.info("Run %s already finished with this spec; returning its stored result.", spec.run_name)
        return dataclasses.replace(stored, reused=True)

    ray.init(address="auto", logging_level=logging.WARNING, ignore_reinit_error=True)
    torch.set_num_threads(spec.driver_threads)  # small models: more threads only contend on a busy node
    resuming = state.get("mlflow_run_id")
    state = state | {"fingerprint": print_key, "mlflow_run_id": start_run(spec, resuming)}
    run_state.write(state)
    mlflow_run_id = state["mlflow_run_id"]
    client = tracking.client(spec)
    try:
        algo = build_algorithm(algo_config)
        try:
            if state.get("checkpoint"):
                algo.restore_from_path(f"{run_state.path}/{state['checkpoint']}", filesystem=run_state.fsys)
                log.info("Restored %s: continuing after iteration %d", state["checkpoint"], algo.iteration)
                backfill(client, mlflow_run_id, state)
            start_iteration = int(algo.iteration)
            started = time.monotonic()
            state = train(spec, algo, run_state, state, client)
            seconds = time.monotonic() - started
            scores = log_policy(spec, algo, mlflow_run_id, client)
        finally:
            stop_algorithm(algo)
        client.log_metric(mlflow_run_id, "train_seconds", seconds)
        client.set_terminated(mlflow_run_id, status="FINISHED")
    except BaseException:
        client.set_terminated(mlflow_run_id, status="FAILED")
        raise
    output = result_of(spec, run_state, state, start_iteration, seconds, scores)
    run_state.write({k: v for k, v in state.items() if k != "unlogged"} | {"result": output.to_dict()})
    return output


if __name__ == "__main__":
    main(run, spec_type=RLlibJobSpec)
