"""The heat map of one layer of one input (`sweep show --png`): the tested head's attention, the
special tokens labelled on the axes and the pair attaining κ outlined (its two rows)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from sweep.show import InputView, kind_name
from workers.token_kinds import TokenKind, reading_label

MAX_TICKS = 40  # label every token up to this many; beyond, only the special tokens


def heatmap_figure(view: InputView, position: int, labels: list[str] | None = None) -> Figure:
    """Layer `view.rows[position]`'s attention A (rows: queries, columns: keys) with the
    attaining pair's rows i and j outlined and its four self-dominance entries ringed."""
    row = view.rows[position]
    a = view.attention[position].astype(np.float64)  # (n, n)
    n = a.shape[0]
    size = min(9.0, 3.0 + 0.12 * n)
    figure = Figure(figsize=(size + 1.2, size), layout="constrained")
    ax = figure.subplots()
    image = ax.imshow(a, cmap="viridis", interpolation="nearest", vmin=0.0)
    figure.colorbar(image, ax=ax, shrink=0.8, label="attention probability")
    special = [t for t in range(n) if view.token_kind[t] != TokenKind.CONTENT]
    ticks = list(range(n)) if n <= MAX_TICKS else special
    names = [_tick(view, t, labels) for t in ticks]
    ax.set_xticks(ticks, names, rotation=90, fontsize=7)
    ax.set_yticks(ticks, names, fontsize=7)
    if row.pair is not None:
        for t in row.pair:
            ax.add_patch(Rectangle((-0.5, t - 0.5), n, 1, fill=False, edgecolor="red",
                                   linewidth=1.2))
        i, j = row.pair
        for r, c in ((i, i), (j, i), (j, j), (i, j)):
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="white",
                                   linewidth=1.5))
    ax.set_xlabel("key token")
    ax.set_ylabel("query token")
    pair = "no pair" if row.pair is None else f"pair ({row.pair[0]}, {row.pair[1]}) in red"
    ax.set_title(f"{view.model} · {view.input_id} · layer {row.layer}: {row.verdict}, "
                 f"κ(A) = {row.kappa:.4f}, margin {row.margin:.3g}\nA (head {view.head}) shown; "
                 f"{pair}; verdict on {reading_label(view.token_set)}", fontsize=9)
    return figure


def _tick(view: InputView, t: int, labels: list[str] | None) -> str:
    kind = view.token_kind[t]
    name = labels[t] if labels and labels[t] else ""
    if kind != TokenKind.CONTENT:
        name = f"{kind_name(kind)} {name}".strip()
    return f"{t} {name}".strip()
