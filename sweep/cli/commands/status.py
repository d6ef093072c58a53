"""`sweep status STORE`: done, pending and failed shards per model and stage, with errors."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict

from storage.attention import EXTRACT_STAGE
from storage.integrity import LAYOUT_REASONS, variable_of
from storage.layout import PREPARE_STAGE
from storage.markers import TrainingProgress
from storage.query.status import (
    AttentionHeld,
    StageStatus,
    attention_held,
    store_status,
    training_now,
)
from sweep.cli.commands.store_args import add_store_argument, store_ref
from sweep.cli.outputs import add_format_argument
from sweep.terminal.faults import EXIT_DAMAGED
from sweep.terminal.printable import printable
from sweep.terminal.progress import duration


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        description="Show what a sweep store holds. Exit code 0 when everything is done, "
        "1 when tasks are pending or failed, 4 when done chunks or metadata are damaged or a "
        "model's group is missing (`sweep run` recomputes them).",
    )
    add_store_argument(parser)
    add_format_argument(parser, ("text", "json"))
    parser.add_argument("--verify", action="store_true",
                        help="re-hash every done task's chunks against its marker's checksums: "
                        "damaged ones count as pending (`sweep run` recomputes them)")
    parser.set_defaults(func=status)


def status(args: argparse.Namespace) -> int:
    stages = store_status(store_ref(args), verify=args.verify)
    training = training_now(store_ref(args))
    if args.format == "json":  # json.dumps escapes control characters itself
        held = {h.model: {"attention_held": h.held, "attention_policy": h.policy}
                for h in attention_held(store_ref(args))}
        trains = {t.model: {"training": t.to_dict()} for t in training}
        print(json.dumps([asdict(s) | {"total": s.total}
                          | (held.get(s.scope, {}) if s.stage == EXTRACT_STAGE else {})
                          | (trains.get(s.scope, {}) if s.stage == PREPARE_STAGE else {})
                          for s in stages], indent=1))
    else:  # names and errors come from the store: printed with their controls escaped
        for line in text_lines(stages, attention_held(store_ref(args)), training):
            print(printable(line))
    if any(s.damaged or s.missing or s.metadata for s in stages):
        return EXIT_DAMAGED
    return 0 if all(s.done == s.total for s in stages) else 1


def text_lines(stages: list[StageStatus], held: list[AttentionHeld],
               training: list[TrainingProgress] = (), now: float | None = None) -> list[str]:
    """The table (its scope column as wide as the longest scope), then a line per model in
    training, failed task, damage, missing group and held attention."""
    width = max([24, *(len(s.scope) for s in stages)])
    out = [f"{'scope':<{width}} {'stage':<9} {'done':>6} {'pending':>8} {'failed':>7} "
           f"{'total':>6}"]
    out += [f"{s.scope:<{width}} {s.stage:<9} {s.done:>6} {s.pending:>8} {len(s.failed):>7} "
            f"{s.total:>6}" for s in stages]
    out += [training_line(t, time.time() if now is None else now) for t in training]
    for s in stages:
        for name, error in sorted(s.failed.items()):
            last = error.strip().splitlines()[-1] if error.strip() else "(no error recorded)"
            out.append(f"failed {s.scope} {name}: {last}")
    for s in stages:
        for name, files in sorted(s.damaged.items()):
            variables = sorted({variable_of(f) for f in files})
            out.append(f"damaged {s.scope} {name}: {', '.join(variables)}; rerun `sweep run` "
                       f"to recompute")
        for key, reason in sorted(s.metadata.items()):
            fix = "repair it" if reason in LAYOUT_REASONS else \
                "recreate it and recompute what it held"
            out.append(f"damaged {s.scope} metadata {key}: {reason}; rerun `sweep run` to {fix}")
        if s.missing:
            out.append(f"missing {s.scope}: its group is gone from the store; rerun `sweep run` "
                       f"to recompute it")
    return out + [h.line() for h in held]


def training_line(progress: TrainingProgress, now: float) -> str:
    """`training vit@seed0 epoch 12 of 40 (val_accuracy 0.9120), 14s so far, last heard 3s ago;
    a kill resumes from epoch 10` (or `restarts it from epoch 0`)."""
    after = ("a kill resumes from epoch " + str(progress.resume_point)
             if progress.resume_point is not None else "a kill restarts it from epoch 0")
    return (f"training {progress.line()}, {duration(progress.elapsed_s)} so far, last heard "
            f"{duration(now - progress.updated)} ago; {after}")
