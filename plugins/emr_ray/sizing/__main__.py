"""``python -m emr_ray.sizing --results COSTS.json [--shape 4x16,2x8:1 ...] [--no-examples]``: the
table of a backfill's prediction for the example EMR shapes and your own, from measured costs. No
server is started: the costs come from a measurement (``bench/sizing.py --measure`` writes them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from emr_ray.sizing.shapes import load_costs, shapes_for, shapes_table

#: the DAGs' defaults among bench.pipeline's contenders: warm pools, deferring at once
CONTENDER = "warm_defer_at_once"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m emr_ray.sizing", description=__doc__)
    parser.add_argument(
        "--results", required=True, help="measured costs (bench/sizing.py or bench/pipeline.py)"
    )
    parser.add_argument(
        "--shape", action="append", default=[], help="a shape of your own: COUNTxCPUS[:GPUS],..."
    )
    parser.add_argument("--no-examples", action="store_true", help="only the shapes given with --shape")
    parser.add_argument("--contender", default=CONTENDER, help="which measured path (bench.pipeline's)")
    parser.add_argument("--days", type=int, default=365, help="partitions of the backfill")
    parser.add_argument("--rows", default="200000,10000000", help="rows per partition, comma separated")
    args = parser.parse_args(argv)
    try:
        shapes = shapes_for(args.shape, examples=not args.no_examples)
        if not shapes:
            parser.error("no shape: give --shape, or leave out --no-examples")
        costs = load_costs(Path(args.results), args.contender)
    except (OSError, ValueError) as e:
        parser.error(str(e))
    rows = [int(r) for r in args.rows.split(",") if r.strip()]
    text = f"measured costs: {costs.source}\n\n{shapes_table(costs, shapes, args.days, rows)}"
    print(text)
    return text


if __name__ == "__main__":
    main()
