"""The test stage as a sweep's test task runs it, per input, against torch.cdist(p=1).

For each case (attention-like stacks at ViT-B, DINOv2-L-reg 224 px, DINOv2-B 336 px and DINOv2 518
px sizes; real `minilm-l6` attention of a few pydoc:topics paragraphs; `tiny`, T = 8, where what the
stage spends per input regardless of size shows) the shard's attention is written to a Zarr store
the way the sweep writes it (`storage.store`), then `workers.tasks.verdicts.run_test` reads it back,
tests both token sets with the rollout and writes the results. Reported per input: wall ms and CPU
ms (process time: every thread of this process) of the whole task, the share of each part (timed by
calling the same functions on the same data; `check` as the stage calls it, with the decision
radius; `radius` is `workers.exact.radius.screened_radius` alone, on screens made before the timing
as `check` makes them), and torch.cdist(x, x, p=1) (float32, torch's threads) over the same
restricted matrices (layers x token sets), with the ratio cdist / stage. Every timing is the best of
`--rounds` interleaved rounds in the same run.

Three parts are also shown against their floors, timed in the same rounds (issue 32's targets:
restriction within 3x, read within 2x, rollout kappa within 1x):
- read: zarr alone decoding the same chunks (the attention, n_tokens and token_kind arrays
  opened before the timing, each input's attention read with `Array.__getitem__` into a fresh
  array);
- restriction: a float64 copy of the same restricted matrices (`astype(np.float64)` of their
  contiguous float32 copies, made before the timing), one at a time, so that its memory
  behaves as the stage's buffer does: glibc's malloc hands a freed array's memory back up to
  its 32 MiB mmap threshold (T = 577) and maps fresh pages above it (T = 1370: 180 MB), as
  `workers.exact.scratch` reuses a buffer up to REUSE_MAX_BYTES and not above;
- rollout kappa: `check` (as the stage calls it) on as many restricted matrices as the rollout's
  kappa is computed on (every layer: the check part itself).

    PYTHONPATH=. python benchmarks/test_stage_bench.py [--rounds 5] [--cases vit-b,dinov2-l-reg]
        [--rollout every] [--no-cdist] [--rollout-device]
        [--store s3://bucket/prefix --endpoint-url http://127.0.0.1:8333]

`--store`: where the shard's store lives (default: a temporary local folder); an object store
URL times the stage reading its shard from there (`storage.location`).

Attention-like: per layer, softmax of N(0, 4) logits with +4 on column 0 (a sink) and +2 on the
diagonal; token 0 is CLS, tokens 1..R registers, the rest content.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from stage_vs_tree import write_test_shard

from storage.location import StoreRef, locate
from storage.store import (
    open_model,
    write_results,
)
from sweep.driver.plan import TestTask
from workers.exact import pruned
from workers.exact.equality import (
    ROLLOUT_MODES,
    check,
    kappa_only,
    restrict_layers,
    rollout_products,
)
from workers.exact.radius import screened_radius
from workers.exact.readings import attaining_kinds
from workers.exact.scratch import scratch
from workers.exact.token_kinds import TokenKind, keep_mask, special_mask
from workers.tasks.extract import rollout_on_device
from workers.tasks.verdicts import evaluate_shard, run_test, shard_attention

TOKEN_SETS = ("all", "content")


@dataclass(frozen=True)
class Case:
    """One benchmark case: a shard of inputs (input, layer, T, T) float32 and their token kinds."""

    name: str
    attention: np.ndarray  # (input, layer, query, key) float32
    token_kind: np.ndarray  # (input, token) int8


def attention_like(rng: np.random.Generator, layers: int, t: int) -> np.ndarray:
    """(layers, t, t) float32 softmax rows of N(0, 4) logits, a sink column and a diagonal boost."""
    logits = 2.0 * rng.normal(size=(layers, t, t))
    logits[:, :, 0] += 4.0
    logits[:, np.arange(t), np.arange(t)] += 2.0
    e = np.exp(logits - logits.max(axis=2, keepdims=True))
    return (e / e.sum(axis=2, keepdims=True)).astype(np.float32)


def synthetic(name: str, inputs: int, layers: int, t: int, registers: int) -> Case:
    rng = np.random.default_rng(0)
    attention = np.stack([attention_like(rng, layers, t) for _ in range(inputs)])
    kinds = np.full((inputs, t), TokenKind.CONTENT, dtype=np.int8)
    kinds[:, 0] = TokenKind.CLS
    kinds[:, 1:1 + registers] = TokenKind.REGISTER
    return Case(name, attention, kinds)


def minilm(inputs: int) -> Case:
    """Real all-MiniLM-L6-v2 attention of the first pydoc:topics paragraphs, padded to T_max."""
    from workers.inputs import DatasetSpec, open_dataset
    from workers.models.extraction import load_extractor
    from workers.models.registry import resolve_model

    dataset = open_dataset(DatasetSpec(kind="text", source="pydoc:topics", limit=inputs))
    extractor = load_extractor(resolve_model("minilm-l6"), device="cpu")
    outs = extractor.extract(dataset.load(range(len(dataset))), dataset.ids)
    t_max = max(out.attention.shape[-1] for out in outs)
    layers = outs[0].attention.shape[0]
    attention = np.zeros((len(outs), layers, t_max, t_max), np.float32)
    kinds = np.full((len(outs), t_max), TokenKind.PAD, dtype=np.int8)
    for i, out in enumerate(outs):
        t = out.attention.shape[-1]
        attention[i, :, :t, :t] = out.attention
        kinds[i, :t] = out.token_kind
    return Case(f"minilm-l6 (T<={t_max}, {layers} layers)", attention, kinds)


CASES: dict[str, Callable[[int], Case]] = {
    "vit-b": lambda n: synthetic("ViT-B (T=197, 12 layers)", n, 12, 197, 0),
    "dinov2-l-reg": lambda n: synthetic("DINOv2-L-reg 224 (T=261, 24 layers)", n, 24, 261, 4),
    "dinov2-b-336": lambda n: synthetic("DINOv2-B 336 (T=577, 12 layers)", max(1, n // 4), 12,
                                        577, 0),
    "dinov2-518": lambda n: synthetic("DINOv2 518 (T=1370, 12 layers)", max(1, n // 8), 12, 1370,
                                      0),
    "minilm": minilm,
    "tiny": lambda n: synthetic("tiny (T=8, 12 layers: the fixed cost per input)", n, 12, 8, 0),
}


def write_shard(store: StoreRef, case: Case) -> TestTask:
    """A store holding the case as one shard, written as the extraction task writes it."""
    n_tokens = (case.token_kind != TokenKind.PAD).sum(axis=1).astype(np.int32)
    return write_test_shard(store, case.attention[:, :, None], n_tokens,  # one head: averaged
                            case.token_kind)


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall s, CPU s of this process) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def part_functions(case: Case, task: TestTask, rollout: str) -> dict[str, Callable[[], object]]:
    """Each part of the stage as a callable over the whole shard, on the data the stage sees."""
    group = open_model(task.store, task.model, mode="r+")
    n_tokens = (case.token_kind != TokenKind.PAD).sum(axis=1)
    jobs = []  # (attention (L, t, t), keep, token kinds)
    for i in range(case.attention.shape[0]):
        t = int(n_tokens[i])
        for token_set in TOKEN_SETS:
            kinds = case.token_kind[i, :t]
            jobs.append((case.attention[i, :, :t, :t], keep_mask(kinds, token_set), kinds))
    stacks = [restrict_layers(a, keep)[0] for a, keep, _ in jobs]
    specials = [special_mask(kinds)[keep] for _, keep, kinds in jobs]
    checked = [check(s, special=m, validate=False, radius=True)
               for s, m in zip(stacks, specials, strict=True)]
    products = [rollout_products(s) for s in stacks]
    results = evaluate_shard(case.attention[:, :, None], n_tokens, case.token_kind, TOKEN_SETS,
                             1e-12, rollout)  # one head: head-averaged

    def read() -> None:  # as run_test reads: one input's attention at a time
        group["n_tokens"][:]
        group["token_kind"][:]
        attention = shard_attention(group, 0, case.attention.shape[0])
        for i in range(case.attention.shape[0]):
            attention[i]

    def write() -> None:
        write_results(group, 0, results)

    parts = {
        "read": read,
        "restriction": lambda: [restrict_layers(a, keep, out=scratch("restricted", a.shape))
                                for a, keep, _ in jobs],
        "check": lambda: [check(s, special=m, validate=False, radius=True)
                          for s, m in zip(stacks, specials, strict=True)],
        "radius": radius_function(stacks, checked),
        "attaining kinds": lambda: [
            attaining_kinds(s, kinds[keep], r.kappa, r.attaining_special, 1e-12)
            for s, (_, keep, kinds), r in zip(stacks, jobs, checked, strict=True)],
    }
    if rollout != "off":
        parts["rollout products"] = lambda: [rollout_products(s, reuse=True) for s in stacks]
        last = rollout == "last"
        parts["rollout kappa"] = lambda: [kappa_only(p[-1:] if last else p) for p in products]
    parts["write"] = write
    return parts


FLOOR_NAMES = {"read": "zarr alone", "restriction": "float64 copy",
               "rollout kappa": "check, same count"}
FLOOR_TARGETS = {"read": 2.0, "restriction": 3.0, "rollout kappa": 1.0}


def floor_functions(case: Case, task: TestTask, rollout: str) -> dict[str, Callable[[], object]]:
    """Each part's floor (FLOOR_NAMES) as a callable over the whole shard, on the same data."""
    group = open_model(task.store, task.model, mode="r")
    arrays = {name: group[name] for name in ("attention", "n_tokens", "token_kind")}
    n_tokens = (case.token_kind != TokenKind.PAD).sum(axis=1)
    restricted, stacks, specials = [], [], []  # float32 (L, m, m); float64 stacks; special masks
    for i in range(case.attention.shape[0]):
        t = int(n_tokens[i])
        for token_set in TOKEN_SETS:
            kinds = case.token_kind[i, :t]
            keep = keep_mask(kinds, token_set)
            layers = case.attention[i, :, :t, :t]
            restricted.append(np.ascontiguousarray(layers[:, keep][:, :, keep]))
            stacks.append(restrict_layers(layers, keep)[0])
            specials.append(special_mask(kinds)[keep])

    def read() -> None:
        arrays["n_tokens"][:]
        arrays["token_kind"][:]
        for i in range(case.attention.shape[0]):
            arrays["attention"][i]

    def copy() -> None:  # one at a time, as the stage restricts into one buffer at a time
        for m in restricted:
            m.astype(np.float64)

    floors = {"read": read, "restriction": copy}
    if rollout != "off":
        count = 1 if rollout == "last" else None  # matrices per stack the rollout's kappa has
        floors["rollout kappa"] = lambda: [
            check(s[:count], special=m, validate=False, radius=True)
            for s, m in zip(stacks, specials, strict=True)]
    return floors


def radius_function(stacks: list[np.ndarray], checked: list) -> Callable[[], object]:
    """`screened_radius` of every tested matrix, alone: the 16-bit screens, row minima and
    bound constants are made before, as `check`'s kernel makes them."""
    jobs = []
    for stack, result in zip(stacks, checked, strict=True):
        for x, kappa, margin in zip(stack, result.kappa, result.margin, strict=True):
            n = x.shape[0]
            rmax = pruned.trusted_rmax(x)
            scale = pruned.scale_for(rmax)
            q = np.zeros(pruned.quantised_shape(n), dtype=np.uint16)
            screened = np.empty((q.shape[0], q.shape[0]), dtype=np.uint16)
            pruned.quantise_matrix(x, q, scale)
            pruned.screen_serial(q, n, screened)
            row_min = np.array([screened[i, i + 1:n].min() for i in range(n - 1)], np.int64)
            c0 = pruned.bound_constants(n, rmax)[1]
            jobs.append((x, screened, row_min, scale, c0, kappa, margin))

    def run() -> None:
        for x, screened, row_min, scale, c0, kappa, margin in jobs:
            screened_radius(x, screened, row_min, scale, c0, kappa, margin, 1e-12)

    return run


def cdist_function(case: Case) -> Callable[[], object]:
    """torch.cdist(p=1) over every input's restricted float32 matrices (layers x token sets)."""
    n_tokens = (case.token_kind != TokenKind.PAD).sum(axis=1)
    mats = []
    for i in range(case.attention.shape[0]):
        t = int(n_tokens[i])
        for token_set in TOKEN_SETS:
            keep = keep_mask(case.token_kind[i, :t], token_set)
            layers = case.attention[i, :, :t, :t]  # (layer, query, key) real tokens
            mats.append(torch.from_numpy(np.ascontiguousarray(layers[:, keep][:, :, keep])))

    def run() -> None:
        for x in mats:
            torch.cdist(x, x, p=1)

    return run


def device_rollout_shard(store: StoreRef, case: Case, rollout: str) -> TestTask:
    """The case's shard with the rollout's kappa already stored, as extraction stores it under
    `rollout_device: extraction` (computed here with torch on the CPU, before any timing): the
    test task then runs no rollout products."""
    n_tokens = (case.token_kind != TokenKind.PAD).sum(axis=1).astype(np.int32)
    attention = case.attention[:, :, None]  # one head: averaged
    kappa = rollout_on_device(attention, n_tokens, case.token_kind, TOKEN_SETS, rollout, "cpu")
    task = write_test_shard(store, attention, n_tokens, case.token_kind, kappa)
    return TestTask(**{**task.__dict__, "rollout": rollout})


def bench(case: Case, rounds: int, rollout: str, store: str | None,
          options: dict[str, str], cdist: bool = True, device_rollout: bool = False) -> None:
    n = case.attention.shape[0]
    with tempfile.TemporaryDirectory() as tmp:
        where = StoreRef.of(store or str(Path(tmp) / "store.zarr"), options)
        task = write_shard(where, case)
        task = TestTask(**{**task.__dict__, "rollout": rollout})
        extra = {}
        if device_rollout:
            moved = device_rollout_shard(StoreRef.of(str(Path(tmp) / "device.zarr")), case,
                                         rollout)
            extra = {"stage, rollout_device: extraction": lambda: run_test(moved)}
        funcs = {"stage": lambda: run_test(task), **extra,
                 **({"cdist": cdist_function(case)} if cdist else {}),
                 **part_functions(case, task, rollout),
                 **{f"floor:{name}": fn
                    for name, fn in floor_functions(case, task, rollout).items()}}
        best = {name: (np.inf, np.inf) for name in funcs}
        for fn in funcs.values():  # warm-up (numba compilation, caches)
            fn()
        for _ in range(rounds):
            for name, fn in funcs.items():
                wall, cpu = timed(fn)
                best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
        locate(where).delete_prefix("")
    stage_wall, stage_cpu = best["stage"]
    parts = [p for p in funcs if p not in ("stage", "cdist", *extra)
             and not p.startswith("floor:")]
    parts_cpu = sum(best[p][1] for p in parts)
    print(f"\n{case.name}: {n} inputs, rollout {rollout}, best of {rounds}, store "
          f"{store or 'a local folder'}")
    print(f"  test stage: {1e3 * stage_wall / n:.2f} ms wall, {1e3 * stage_cpu / n:.2f} ms CPU "
          f"per input")
    for name in extra:
        wall, cpu = best[name]
        print(f"  test stage, rollout_device: extraction (no products): {1e3 * wall / n:.2f} ms "
              f"wall, {1e3 * cpu / n:.2f} ms CPU per input ({cpu / stage_cpu:.2f}x the stage)")
    if cdist:
        cdist_wall, cdist_cpu = best["cdist"]
        print(f"  torch.cdist(p=1), same matrices: {1e3 * cdist_wall / n:.2f} ms wall, "
              f"{1e3 * cdist_cpu / n:.2f} ms CPU per input; cdist / stage = "
              f"{cdist_wall / stage_wall:.2f}x wall, {cdist_cpu / stage_cpu:.2f}x CPU")
    print(f"    {'part':<17} {'wall ms':>8} {'CPU ms':>8} {'CPU share':>9}  "
          f"{'floor':<18} {'CPU ms':>8} {'part/floor':>10}  (per input)")
    for name in parts:
        wall, cpu = best[name]
        line = (f"    {name:<17} {1e3 * wall / n:8.2f} {1e3 * cpu / n:8.2f} "
                f"{100 * cpu / parts_cpu:8.1f}%")
        if f"floor:{name}" in best:
            floor_cpu = best[f"floor:{name}"][1]
            line += (f"  {FLOOR_NAMES[name]:<18} {1e3 * floor_cpu / n:8.2f} "
                     f"{cpu / floor_cpu:9.2f}x (target <= {FLOOR_TARGETS[name]:g}x)")
        print(line)
    print(f"  radius / check (CPU): {100 * best['radius'][1] / best['check'][1]:.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="vit-b,dinov2-l-reg,dinov2-b-336,dinov2-518,minilm")
    parser.add_argument("--inputs", type=int, default=8,
                        help="inputs per case (336 px: / 4, 518 px: / 8)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rollout", default="every", choices=ROLLOUT_MODES)
    parser.add_argument("--store", help="the shard's store (default: a temporary folder)")
    parser.add_argument("--endpoint-url", help="an S3-compatible server for an s3:// --store")
    parser.add_argument("--cdist", action=argparse.BooleanOptionalAction, default=True,
                        help="time torch.cdist on the same matrices (at T = 1370: 30 s a round)")
    parser.add_argument("--rollout-device", action="store_true",
                        help="also the stage with the rollout's kappa stored by extraction")
    args = parser.parse_args()
    options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else {}
    print(f"torch threads {torch.get_num_threads()}")
    for name in args.cases.split(","):
        store = f"{args.store.rstrip('/')}/{name}.zarr" if args.store else None
        bench(CASES[name](args.inputs), args.rounds, args.rollout, store, options, args.cdist,
              args.rollout_device)


if __name__ == "__main__":
    main()
