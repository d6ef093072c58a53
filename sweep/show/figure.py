"""The heat map of one layer of one input (`sweep show --png`): the tested head's attention, the
special tokens labelled on the axes and the pair attaining κ outlined (its two rows). Mathtext
is off: a token, an id or a file name holding `$` is drawn as written, never parsed."""

from __future__ import annotations

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from sweep.show.view import InputView, kind_name
from workers.exact.token_kinds import TokenKind, reading_label

MAX_TICKS = 40  # label every token up to this many; beyond, only the special tokens


@matplotlib.rc_context({"text.parse_math": False})  # `$` in a token or name is text (item 9)
def heatmap_figure(view: InputView, position: int, labels: list[str] | None = None,
                   picture: np.ndarray | None = None, patch: int | None = None) -> Figure:
    """Layer `view.rows[position]`'s attention A (rows: queries, columns: keys) with the
    attaining pair's rows i and j outlined and its four self-dominance entries ringed; beside
    it, for an image, the `picture` the model saw with its patch grid and the pair's patches
    outlined."""
    row = view.rows[position]
    a = view.attention[position].astype(np.float64)  # (n, n)
    n = a.shape[0]
    size = min(9.0, 3.0 + 0.12 * n)
    grid = patch_grid(view.token_kind, picture, patch)
    figure = Figure(figsize=(size * (2 if grid else 1) + 1.2, size), layout="constrained")
    axes = figure.subplots(1, 2 if grid else 1, squeeze=False).ravel()
    ax = axes[0]
    if grid:
        draw_patches(axes[1], picture, patch, grid, row.pair)
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


def patch_grid(kinds: np.ndarray, picture: np.ndarray | None, patch: int | None
               ) -> tuple[int, int, int] | None:
    """(first content token, rows, columns) of the patch grid when the content tokens follow
    the special ones and tile `picture` in patches of `patch` px row-major; else None."""
    if picture is None or not patch:
        return None
    rows, columns = picture.shape[0] // patch, picture.shape[1] // patch
    content = np.flatnonzero(kinds == TokenKind.CONTENT)
    first = int(kinds.size - content.size)
    if content.size != rows * columns or not np.array_equal(content,
                                                            np.arange(first, kinds.size)):
        return None
    return first, rows, columns


def draw_patches(ax, picture: np.ndarray, patch: int, grid: tuple[int, int, int],
                 pair: tuple[int, int] | None) -> None:
    """The picture with its patch grid; the pair's patches outlined in red (a special token of
    the pair has no patch: named in the title)."""
    first, rows, columns = grid
    ax.imshow(picture, interpolation="nearest")
    for r in range(1, rows):
        ax.axhline(r * patch - 0.5, color="white", linewidth=0.4, alpha=0.6)
    for c in range(1, columns):
        ax.axvline(c * patch - 0.5, color="white", linewidth=0.4, alpha=0.6)
    unplaced = []
    for t in pair or ():
        if t < first:
            unplaced.append(str(t))
            continue
        r, c = divmod(t - first, columns)
        ax.add_patch(Rectangle((c * patch - 0.5, r * patch - 0.5), patch, patch, fill=False,
                               edgecolor="red", linewidth=2.0))
        ax.annotate(str(t), (c * patch + 1, r * patch + 1), color="red", fontsize=8,
                    va="top", ha="left")
    ax.set_xticks([])
    ax.set_yticks([])
    note = f"; tokens {', '.join(unplaced)} are special (no patch)" if unplaced else ""
    ax.set_title(f"the input as the model saw it ({rows}×{columns} patches of {patch} px)"
                 f"{note}", fontsize=9)
