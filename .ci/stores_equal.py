"""Whether two sweep stores hold the same arrays, value for value (NaN equals NaN, dtype and shape
included): `python .ci/stores_equal.py REFERENCE OTHER [--endpoint-url URL]`, run from the
repository root. Prints one line; exit 0 when every array of both stores is equal, 1 otherwise.
Used by .ci/image-check.sh (a run through the worker image against a local run)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from storage.location import StoreRef  # noqa: E402
from tests.store_fixtures import stored_arrays  # noqa: E402


def differing(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """Paths of the arrays that are in one store only, or differ in dtype, shape or a value."""
    out = sorted(set(a) ^ set(b))
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        if x.dtype != y.dtype or not np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"):
            out.append(key)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference")
    parser.add_argument("other")
    parser.add_argument("--endpoint-url", help="an S3-compatible server for s3:// stores")
    args = parser.parse_args()
    options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else {}
    a = stored_arrays(StoreRef.of(args.reference, options))
    b = stored_arrays(StoreRef.of(args.other, options))
    bad = differing(a, b)
    print(f"stores-equal: {args.other} against {args.reference}: {len(set(a) | set(b))} arrays, "
          f"{len(bad)} differ" + (f" ({', '.join(bad[:10])})" if bad else ""))
    return 1 if bad or not a else 0


if __name__ == "__main__":
    sys.exit(main())
