"""The training loop's batch contract: which columns become which typed model inputs.

A model's inputs are declared in the loop's config under ``inputs``, an ordered list; the loop calls
``model(*inputs)`` in that order. Three shapes cover the workloads here:

- ``{"name": "features", "columns": ["f0", "f1"], "dtype": "float32"}``: scalar columns stacked into
  ``[n, len(columns)]`` (tables, and images as pixel columns);
- ``{"name": "user", "column": "user_idx", "dtype": "int64"}``: one scalar column as ``[n]`` (ids);
- ``{"name": "tokens", "column": "tokens", "dtype": "int64", "length": 64, "pad": 0}``: one list column,
  each row padded or truncated to ``[n, length]`` (token ids, histories).

Without ``inputs`` a config with ``feature_columns`` means one float32 matrix of those columns, so the
tabular and digits models (``model(x)``) need no change. ``label_column`` is the int64 class index;
``metric_columns`` are scalar columns read for metrics only (never given to the model).

:func:`batch_spec` validates a config where it is built (the training spec checks it before
submitting) and where it is read (the loop), with messages that name the input and the fix.
Conversion is vectorised with numpy: list columns go from Arrow's flat values and offsets into a padded
matrix without a Python loop over rows. Runs on both sides; numpy and torch are imported inside
functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from emr_ray.cluster.spec import SpecError

DTYPES = ("float32", "int64")


@dataclass(frozen=True)
class Input:
    """One positional input of the model: ``columns`` stacked, or one ``column`` (scalar or list)."""

    name: str
    columns: tuple[str, ...]
    dtype: str = "float32"
    length: int | None = None  # a list column, padded or truncated to this many values per row
    pad: float = 0
    stacked: bool = True  # ``columns`` given: [n, k]; one ``column``: [n] or [n, length]

    @classmethod
    def from_dict(cls, data: Any, position: int) -> Input:
        where = f"inputs[{position}]"
        if not isinstance(data, dict):
            raise SpecError(
                f"{where} must be an object like {{'name': 'x', 'columns': [...]}}, got {data!r}."
            )
        unknown = sorted(set(data) - {"name", "column", "columns", "dtype", "length", "pad"})
        if unknown:
            raise SpecError(
                f"{where} has unknown key(s) {unknown}; use name, column or columns, dtype, length, pad."
            )
        name = str(data.get("name") or "")
        if not name:
            raise SpecError(f"{where} has no name; name every input (it documents what the model receives).")
        where = f"input {name!r}"
        has_column, has_columns = "column" in data, "columns" in data
        if has_column == has_columns:
            raise SpecError(
                f"{where} needs exactly one of 'column' (one scalar or list column) or 'columns' (a list)."
            )
        dtype = str(data.get("dtype", "float32"))
        if dtype not in DTYPES:
            raise SpecError(f"{where} has dtype {dtype!r}; use one of {', '.join(DTYPES)}.")
        length = data.get("length")
        if length is not None and (not has_column or int(length) < 1):
            raise SpecError(f"{where}: 'length' (>= 1) pads one list 'column'; drop it or use 'column'.")
        columns = (str(data["column"]),) if has_column else tuple(str(c) for c in data["columns"] or ())
        if not columns or not all(columns):
            raise SpecError(f"{where} names no column; list the columns it reads.")
        pad = data.get("pad", 0)
        return cls(name, columns, dtype, int(length) if length is not None else None, pad, not has_column)

    def tensor(self, table: Any):
        """This input's rows of a pyarrow ``table`` as a torch tensor (a fresh, contiguous array)."""
        import numpy as np
        import torch

        dtype = np.dtype(self.dtype)
        n = table.num_rows if table is not None else 0
        if self.length is not None:
            return torch.from_numpy(
                _padded(table.column(self.columns[0]) if n else None, n, self.length, self.pad, dtype)
            )
        if not self.stacked:
            return torch.from_numpy(_column_array(table.column(self.columns[0]) if n else None, n, dtype))
        matrix = np.empty((n, len(self.columns)), dtype=dtype)
        if n:
            for j, column in enumerate(self.columns):
                _fill(matrix[:, j], table.column(column))
        return torch.from_numpy(matrix)


def _column_array(column: Any, n: int, dtype: Any):
    """A pyarrow column (``None`` when there are no rows) as a fresh numpy array of ``n`` ``dtype``."""
    import numpy as np

    out = np.empty((n,), dtype=dtype)
    if n:
        _fill(out, column)
    return out


def _fill(out: Any, column: Any) -> None:
    """Copy a pyarrow column's values into ``out`` (a 1-D numpy array or a column of a matrix), chunk
    by chunk, converting to ``out``'s dtype: one copy, straight from Arrow's buffers.

    Fixed-width numbers without nulls are read as views of their Arrow buffers. pyarrow's own
    ``to_numpy`` goes through its pandas conversion: a copy per column (all chunks joined) before the
    copy into ``out``, and the first call in a process imports pandas (0.2-1.0 s in a fresh worker
    here, more than reading its rows cold: ``bench/results/SUMMARY.md``, 2026-12-05). Anything else
    (nulls, booleans, dictionaries) still takes ``to_numpy``.
    """
    import pyarrow as pa

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    start = 0
    for chunk in chunks:
        stop = start + len(chunk)
        if stop > start:
            out[start:stop] = _numpy(chunk)
        start = stop
    if start != len(out):
        raise ValueError(f"A column of {start} rows for {len(out)} rows; the table's columns must align.")


def _numpy(chunk: Any):
    """One Arrow array as numpy: a read-only view of its buffer for numbers without nulls, else a copy."""
    import numpy as np
    import pyarrow as pa

    kind = chunk.type
    if chunk.null_count == 0 and (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        letter = "f" if pa.types.is_floating(kind) else "i" if pa.types.is_signed_integer(kind) else "u"
        dtype = np.dtype(f"<{letter}{kind.bit_width // 8}")
        return np.frombuffer(
            chunk.buffers()[1], dtype=dtype, count=len(chunk), offset=chunk.offset * dtype.itemsize
        )
    return chunk.to_numpy(zero_copy_only=False)


def _padded(column: Any, n: int, length: int, pad: float, dtype: Any):
    """A list column as an ``[n, length]`` array: each row's first ``length`` values, then ``pad``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    out = np.full((n, length), pad, dtype=dtype)
    if not n:
        return out
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    lengths = pc.list_value_length(array)
    if lengths.null_count:  # a null list pads its row (fill_null only then: a Python scalar imports pandas)
        lengths = pc.fill_null(lengths, 0)
    lengths = _column_array(lengths, n, np.int64)
    flat = pc.list_flatten(array)  # nulls inside a list are not allowed
    values = _column_array(flat, len(flat), dtype)
    starts = np.cumsum(lengths) - lengths
    keep = np.arange(length)[None, :] < np.minimum(lengths, length)[:, None]
    out[keep] = values[(starts[:, None] + np.arange(length)[None, :])[keep]]
    return out


@dataclass(frozen=True)
class BatchSpec:
    """What the loop reads and how it feeds the model: inputs in call order, the label, metric columns."""

    inputs: tuple[Input, ...]
    label: str
    metric_columns: tuple[str, ...] = field(default_factory=tuple)

    @property
    def columns(self) -> list[str]:
        """Every column to read, each once, in a stable order."""
        names = [c for i in self.inputs for c in i.columns] + [self.label, *self.metric_columns]
        return list(dict.fromkeys(names))

    def tensors(self, table: Any):
        """``(inputs, labels, extras)`` of a pyarrow table: a tuple of tensors in call order, int64
        labels ``[n]``, and the metric columns by name (float64 ``[n]``). ``table`` may be None (no rows)."""
        import numpy as np
        import torch

        n = table.num_rows if table is not None else 0

        def column(name: str, dtype: Any):
            return torch.from_numpy(_column_array(table.column(name) if n else None, n, dtype))

        extras = {c: column(c, np.float64) for c in self.metric_columns}
        inputs = tuple(i.tensor(table) for i in self.inputs)
        return inputs, column(self.label, np.int64), extras


def batch_spec(config: dict[str, Any]) -> BatchSpec:
    """The loop's batch contract from its config (``inputs`` or ``feature_columns``, ``label_column``)."""
    label = config.get("label_column")
    if not label:
        raise SpecError(
            "The training config has no label_column; name the column that holds the class index."
        )
    raw = config.get("inputs")
    if raw is None:
        features = config.get("feature_columns")
        if not features:
            raise SpecError(
                "The training config declares neither inputs nor feature_columns; declare the model's inputs."
            )
        raw = [{"name": "features", "columns": list(features), "dtype": "float32"}]
    if not isinstance(raw, list) or not raw:
        raise SpecError(f"inputs must be a non-empty list of input objects, got {raw!r}.")
    inputs = tuple(Input.from_dict(item, i) for i, item in enumerate(raw))
    names = [i.name for i in inputs]
    if len(set(names)) != len(names):
        raise SpecError(f"inputs repeat a name: {names}; give every input its own name.")
    metric_columns = config.get("metric_columns") or []
    if not isinstance(metric_columns, list):
        raise SpecError(f"metric_columns must be a list of column names, got {metric_columns!r}.")
    return BatchSpec(inputs, str(label), tuple(str(c) for c in metric_columns))


def declares_batches(config: dict[str, Any]) -> bool:
    """Whether a config uses this contract: declared ``inputs``, or ``feature_columns`` with a
    ``label_column`` (a custom loop may read its data its own way)."""
    return "inputs" in config or ("feature_columns" in config and "label_column" in config)
