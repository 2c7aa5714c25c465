"""``accelkit conformance {run,report,diff,coverage,coverage-diff}`` (also ``python -m accelkit_conformance``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from accelkit_conformance import cli, runner


def build_parser(prog: str = "accelkit conformance") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run PyTorch's OpInfo and module tests and accelkit's contract and dynamic-shape "
                    "checks against accelkit backends, and render or compare the results.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run", help="run the suites against one or more backends (one subprocess each)",
        description="Run the suites against each backend in its own pytest subprocess (xdist workers "
                    "isolate crashes; per-test timeouts). Writes DIR/<backend>/results.jsonl as tests "
                    "finish, then results.json, report.md and report.html.",
    )
    runner.add_run_arguments(run)
    run.set_defaults(run=runner.run_command)
    cli.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "accelkit conformance") -> int:
    args = build_parser(prog).parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main(prog="python -m accelkit_conformance"))
