"""The training's data as MLflow itself shows it: each input dataset is an MLflow dataset input of the
run (the committed generation's URI as its source, the generation's digest, its schema and rows), so
MLflow's UI says which data a model version came from, without our tags. The champion comparison
adds the rows both models were scored on, with the test dataset's digest: the same rows, visibly.

The driver describes the inputs once (:func:`describe`: from the plan, whose footers it read, no data
read) and puts them in the shard plan; whoever starts the run (the driver, or a warm group's rank 0)
logs them (:func:`log_inputs`), and the comparison logs its rows (:func:`log_compared_rows`).
Runs on the cluster: never imports Airflow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from emr_ray.cluster import storage
from emr_ray.cluster.spec import SpecPart

#: where the described inputs travel in the shard plan
PLAN_KEY = "run_inputs"
#: MLflow's input tag for what a dataset was used for
CONTEXT_TAG = "mlflow.data.context"
#: MLflow's names for Arrow's common column types (others show as Arrow names them)
_MLFLOW_TYPES = {
    "int32": "integer",
    "int64": "long",
    "float": "float",
    "double": "double",
    "string": "string",
    "large_string": "string",
    "bool": "boolean",
    "binary": "binary",
}


@dataclass(frozen=True, kw_only=True)
class RunInput(SpecPart):
    """One input of a training: its name in the spec (``train``, ``test``), the committed generation's
    URI, the generation, its digest (files and checksums: :meth:`emr_ray.cluster.partitions.Committed.digest`),
    its rows and its columns (name to type)."""

    name: str
    source: str
    generation: str
    digest: str
    rows: int
    schema: dict[str, str] = field(default_factory=dict)

    @property
    def context(self) -> str:
        return {"train": "training", "test": "testing"}.get(self.name, self.name)

    def as_mlflow(self, *, name: str | None = None, context: str | None = None, **tags: str) -> Any:
        """This input as MLflow's ``DatasetInput`` (``name``, ``context``: another use of the same rows)."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        colspec = [{"name": column, "type": kind, "required": True} for column, kind in self.schema.items()]
        dataset = Dataset(
            name=name or self.name,
            digest=self.digest,
            source_type=storage.split_uri(self.source)[0] or "local",
            source=json.dumps({"uri": self.source, "generation": self.generation}),
            schema=json.dumps({"mlflow_colspec": colspec}),
            profile=json.dumps({"num_rows": self.rows}),
        )
        pairs = {CONTEXT_TAG: context or self.context, **tags}
        return DatasetInput(dataset, tags=[InputTag(key, value) for key, value in pairs.items()])


def describe(inputs: dict[str, tuple[Any, str]], plan: dict[str, Any]) -> list[RunInput]:
    """Each dataset of the plan as a :class:`RunInput`: ``inputs`` maps its name to its committed
    generation and output name (the job's ``resolve_inputs``); the schema is the columns the plan
    read from the first file's footer (:func:`emr_ray.cluster.storage.parquet_footers`)."""
    described = []
    for name, entry in plan["datasets"].items():
        committed, output = inputs[name]
        described.append(
            RunInput(
                name=name,
                source=committed.output_uri(output),
                generation=committed.generation,
                digest=committed.digest(),
                rows=sum(rows for _, rows in entry["files"]),
                schema=mlflow_types(entry.get("columns", {})),
            )
        )
    return described


def mlflow_types(columns: dict[str, str]) -> dict[str, str]:
    """Columns (name to Arrow type name) with MLflow's type names where it has one."""
    return {name: _MLFLOW_TYPES.get(kind, kind) for name, kind in columns.items()}


def of_plan(plan: dict[str, Any] | None) -> list[RunInput]:
    """The described inputs the plan carries (none for a plan made without them)."""
    return [RunInput.from_dict(item) for item in (plan or {}).get(PLAN_KEY, [])]


def log_inputs(client: Any, run_id: str, run_inputs: list[RunInput]) -> None:
    """The run's inputs, in one request. Logging them again (a resumed run) adds nothing: MLflow keeps
    one input per dataset and run."""
    if run_inputs:
        client.log_inputs(run_id, datasets=[item.as_mlflow() for item in run_inputs])


def log_compared_rows(
    client: Any, run_id: str, plan: dict[str, Any] | None, model_name: str, version: str, rows: int | None
) -> None:
    """The rows the champion (version ``version`` of ``model_name``) and this model were both scored
    on (the plan's ``test`` input), as an input of their own named after that version, with the test
    dataset's digest: the same rows, visibly; a later comparison with another champion adds its own."""
    test = next((item for item in of_plan(plan) if item.name == "test"), None)
    if test is None:
        return
    scored = {"emr_ray.compare.champion": f"{model_name} v{version}", "emr_ray.compare.rows": str(rows)}
    compared = test.as_mlflow(
        name=f"test scored with {model_name} v{version}", context="evaluation", **scored
    )
    client.log_inputs(run_id, datasets=[compared])
