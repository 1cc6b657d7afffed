"""The loop's batch conversion: pyarrow rows -> typed tensors, before and after the typed contract.

Issue 15 made the training loop's feed general (``emr_ray.cluster.batches``: float matrices, int ids, padded
list columns) and asked that the tabular path stay as fast as it was. This runs, in one process and
side by side on the same in-memory tables (no Ray, no files: only the conversion):

- tabular, 1M rows x 16 float32 + label: ``before``, the loop's conversion as it was (one float32
  matrix filled column by column) against ``batches``, ``BatchSpec.tensors`` for the same columns;
- token lists, 200k rows of 4-96 int64 ids padded to 64: ``per_row``, a padding loop over Python lists
  (what a straightforward list feed does) against ``batches`` (numpy over Arrow's values and offsets).

Contenders alternate within each round, in flipped order every other round; the figure is the
median of ``--repeat`` rounds. Prints a
table with ratios and writes ``bench/results/batch_feed-<time>.json``.
``bash scripts/loopback.sh .venv/bin/python -m bench.batch_feed`` (about 1 minute here).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench._common import machine, per_second, table, write_json
from include.data.synthetic import FEATURE_COLUMNS, LABEL_COLUMN


def before(tbl, features: list[str], label: str):
    """The loop's conversion before the typed contract (``include/training/loop.py`` at 6a7ff2a)."""
    import numpy as np
    import torch

    x = np.empty((tbl.num_rows, len(features)), dtype=np.float32)
    for j, column in enumerate(features):
        x[:, j] = tbl.column(column).to_numpy()
    y = np.ascontiguousarray(tbl.column(label).to_numpy(), dtype=np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def per_row(tbl, column: str, length: int):
    """Pad each row's list in Python: the plain way to feed a list column."""
    import torch

    rows = [ids[:length] + [0] * (length - len(ids[:length])) for ids in tbl.column(column).to_pylist()]
    return torch.tensor(rows, dtype=torch.int64)


def tabular_table(rows: int):
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(0)
    columns = {c: pa.array(rng.normal(size=rows).astype(np.float32)) for c in FEATURE_COLUMNS}
    return pa.table({**columns, LABEL_COLUMN: pa.array(rng.integers(0, 2, rows))})


def tokens_table(rows: int, vocab: int = 20_000):
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(1)
    lengths = rng.integers(4, 97, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(rng.integers(2, vocab, int(offsets[-1])), pa.int64())
    return pa.table({"tokens": pa.ListArray.from_arrays(pa.array(offsets), values),
                     "label": pa.array(rng.integers(0, 2, rows))})  # fmt: skip


def rounds(contenders: dict[str, Any], repeat: int) -> dict[str, list[float]]:
    """Each contender once per round; the order flips every round (the one that runs second pays for
    freeing the other's arrays, which alone moved figures by 1.5x here)."""
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for i in range(repeat):
        for name, run in list(contenders.items())[:: -1 if i % 2 else 1]:
            started = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - started)
    return seconds


def main() -> None:
    import torch

    from emr_ray.cluster.batches import batch_spec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="tabular rows")
    parser.add_argument("--token-rows", type=int, default=200_000, help="rows of token lists")
    parser.add_argument("--length", type=int, default=64, help="padded length of a token list")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = machine()

    tab = tabular_table(args.rows)
    tab_spec = batch_spec({"feature_columns": FEATURE_COLUMNS, "label_column": LABEL_COLUMN})
    old_x, old_y = before(tab, FEATURE_COLUMNS, LABEL_COLUMN)
    (new_x,), new_y, _ = tab_spec.tensors(tab)
    assert torch.equal(old_x, new_x) and torch.equal(old_y, new_y)  # the same tensors, or no comparison
    tabular = rounds({"before": lambda: before(tab, FEATURE_COLUMNS, LABEL_COLUMN),
                      "batches": lambda: tab_spec.tensors(tab)}, args.repeat)  # fmt: skip

    tok = tokens_table(args.token_rows)
    tok_spec = batch_spec({"label_column": "label", "inputs": [
        {"name": "tokens", "column": "tokens", "dtype": "int64", "length": args.length}]})  # fmt: skip
    assert torch.equal(per_row(tok, "tokens", args.length), tok_spec.tensors(tok)[0][0])
    tokens = rounds({"per_row": lambda: per_row(tok, "tokens", args.length),
                     "batches": lambda: tok_spec.tensors(tok)}, args.repeat)  # fmt: skip

    results = {"machine": info, "args": vars(args), "loadavg_at_end": list(__import__("os").getloadavg())}
    lines = []
    for case, rows, seconds, base in (("tabular 16 x float32", args.rows, tabular, "before"),
                                       (f"token lists -> [n, {args.length}]", args.token_rows, tokens, "per_row")):  # fmt: skip
        best = {name: min(s) for name, s in seconds.items()}
        medians = {name: statistics.median(s) for name, s in seconds.items()}
        results[case] = {"rows": rows, "seconds": seconds, "best": best, "median": medians}
        for name in seconds:
            lines.append([case, name, f"{best[name]:.4f}", f"{medians[name]:.4f}", per_second(rows / best[name]),
                          f"{best[base] / best[name]:.2f}x", f"{medians[base] / medians[name]:.2f}x"])  # fmt: skip
    headers = ["case", "contender", "best s", "median s", "rows/s (best)", "speed (best)", "speed (median)"]
    print(table(headers, lines))
    print(
        f"load average at start {info['loadavg_at_start']}, at end {[round(v, 2) for v in results['loadavg_at_end']]}"
    )
    path = write_json(f"batch_feed-{time.strftime('%Y%m%d-%H%M%S')}.json", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
