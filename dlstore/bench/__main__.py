"""Command line of ``python -m dlstore.bench``: one sub-command per registered scenario."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from dlstore import _console
from dlstore._console import Parser
from dlstore.bench import SCENARIOS, load_scenario, metrics, report


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m dlstore.bench",
        description="Benchmarks of training-data storage: what dlstore reads, how fast, at what CPU cost.")
    sub = parser.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    for name, scenario in SCENARIOS.items():
        p = sub.add_parser(name, help=scenario.summary, description=scenario.summary)
        load_scenario(name).add_arguments(p)
        metrics.add_arguments(p)
    return parser


def main(argv: Optional[List[str]] = None) -> int:

    args = build_parser().parse_args(argv)
    module = load_scenario(args.scenario)
    unit = getattr(getattr(module, "WORKLOAD", None), "unit", "records")

    def command() -> int:
        for option in ("json", "markdown"):  # a path that cannot take the file is said now, not after the run
            report.check_output_path(f"--{option}", getattr(args, option, None))
        # The scenario updates args.metrics (None without --metrics-port) as its steps complete.
        args.metrics = metrics.serve_from_args(args, args.scenario, unit)
        try:
            status = module.run(args)
            metrics.linger(args.metrics, args.metrics_linger)
            return status
        finally:
            if args.metrics is not None:
                args.metrics.close()

    return _console.run(f"python -m dlstore.bench {args.scenario}", command)


if __name__ == "__main__":
    sys.exit(main())
