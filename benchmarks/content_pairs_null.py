"""The content-pairs null drawn as read (T x T, pairs of |C| full rows) beside the |C| x |C|
draw it replaced, 4,000 trials each.

    PYTHONPATH=. python benchmarks/content_pairs_null.py
"""
import numpy as np

from workers.nulls.matched import count_full_row_holding
from workers.nulls.registry import count_holding, get_null

for null in ("uniform", "softmax-b1", "qk-d24"):
    for t, c in ((14, 13), (31, 30), (20, 18)):
        full = count_full_row_holding(get_null(null), np.random.default_rng(0), t, c, 4000)[0]
        old = count_holding(get_null(null), np.random.default_rng(0), c, 4000)[0]
        print(f"{null:11s} T={t:3d} |C|={c:3d}  as read {full / 4000:.3f}  "
              f"|C|x|C| {old / 4000:.3f}")
