"""Local weights in a model's fingerprint: the files a model loads from this machine, by digest.

A model spec names its weights by place (`hf:/models/vit`, a timm `weights:` file, the MiniLM
package folder), so overwriting them in place would change the model under the same spec: a
resumed store would mix shards of two models. Each such model group keeps `weights_files`,
`{file name: [size, mtime_ns, sha256]}` of the weights, configuration and tokenizer files it
loaded; a resume re-hashes a file only when its size or mtime changed (copied to another
machine, touched) and refuses, naming the file, when its content did. Hub ids (downloaded,
versioned by the hub), tiny presets, controls and FT-Transformers (trained into the store's
checkpoint cache, keyed by their recipe) load nothing local and keep no record.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from storage.store import StoreMismatchError
from workers.models.registry import ModelSpec

RECORDED = ("*.safetensors", "*.json", "*.txt", "*.model")  # weights, config, tokenizer
ATTR = "weights_files"


def weight_files(spec: ModelSpec) -> list[Path]:
    """The local files `spec` loads its model from (empty when none: see the module)."""
    if spec.random_init or not spec.pretrained:
        return []
    if spec.family == "timm":
        return [Path(spec.weights)] if spec.weights else []
    if spec.family != "hf":
        return []
    from workers.models.hf import model_folder

    folder = Path(model_folder(spec))
    if not folder.is_dir():
        return []  # a hub id
    return sorted({p for pattern in RECORDED for p in folder.glob(pattern) if p.is_file()})


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def weights_record(spec: ModelSpec, known: Mapping[str, Any] | None = None
                   ) -> dict[str, list]:
    """`{name: [size, mtime_ns, sha256]}` of `spec`'s local files; a file whose size and mtime
    match its entry in `known` keeps that entry's digest instead of being read again."""
    out = {}
    for path in weight_files(spec):
        stat = path.stat()
        before = (known or {}).get(path.name)
        if before is not None and list(before[:2]) == [stat.st_size, stat.st_mtime_ns]:
            out[path.name] = list(before)
        else:
            out[path.name] = [stat.st_size, stat.st_mtime_ns, _sha256(path)]
    return out


def check_weights(store: str, model: str, stored: Mapping[str, Any] | None,
                  current: Mapping[str, Any]) -> None:
    """StoreMismatchError naming the first file whose content differs from the one the model's
    stored shards were extracted with (or that appeared or vanished); a store that recorded
    nothing (made before this check) passes."""
    if stored is None:
        return
    for name in sorted(set(stored) | set(current)):
        old, new = stored.get(name), current.get(name)
        if old is None or new is None or old[2] != new[2]:
            change = ("is new" if old is None else "is gone" if new is None else
                      f"changed (sha256 {old[2][:12]}... -> {new[2][:12]}...)")
            raise StoreMismatchError(
                f"store {store}: model {model!r} was extracted with other weights: {name} "
                f"{change}; restore the files, sweep into a new store, or delete the group "
                f"{model!r} from the store to extract it again")
