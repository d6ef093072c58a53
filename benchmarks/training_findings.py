"""The report's findings over training, kept beside the docs that quote them.

Builds the report of a store swept over checkpoints (`sweep.report.tables.build_report`) and
writes the tables its over-training findings are read from (`trajectory`, `trajectory_pairs`,
and the findings themselves) to one JSON file; prints the findings as the Markdown lines that
docs/training.md and the README quote. `tests/test_training_findings.py` checks that the file's
findings are what the report's code reads from its tables, and that the docs quote them word for
word (`<!-- findings: FILE -->` ... `<!-- /findings -->`).

    PYTHONPATH=. python benchmarks/training_findings.py runs/vit-objectives.zarr \\
        docs/figures/vit-objectives.findings.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from storage.query.results import open_results
from sweep.report.tables import _records, build_report
from sweep.report.training import FINDING_KINDS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    report = build_report(open_results(args.store), args.store)
    findings = report.findings[report.findings["kind"].isin(FINDING_KINDS)]
    document = {"store": args.store, "ci_method": report.ci_method,
                "trajectory": _records(report.trajectory),
                "trajectory_pairs": _records(report.trajectory_pairs),
                "findings": _records(findings)}
    args.out.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")
    for text in findings["text"]:
        print(f"- {text}")


if __name__ == "__main__":
    main()
