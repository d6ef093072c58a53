"""Offline tokenizers for the tiny text models: trained in-process on CPython's pydoc topics.

Deterministic (fixed corpus, fixed vocabulary size, single-threaded merge order), no download.
"""

from __future__ import annotations

import json
from functools import cache

from transformers import BertTokenizer, PreTrainedTokenizerBase, RobertaTokenizer

VOCAB_SIZE = 1000
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def _corpus() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[key] for key in sorted(topics)]


@cache
def _wordpiece_vocab() -> str:
    from tokenizers import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(lowercase=True)
    tokenizer.train_from_iterator(
        _corpus(), vocab_size=VOCAB_SIZE, special_tokens=BERT_SPECIALS, show_progress=False
    )
    return json.dumps(tokenizer.get_vocab(), sort_keys=True)


@cache
def _bpe_model() -> str:
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(
        _corpus(), vocab_size=VOCAB_SIZE, special_tokens=ROBERTA_SPECIALS, show_progress=False
    )
    return tokenizer.to_str()


def tiny_tokenizer(model_type: str, max_length: int) -> PreTrainedTokenizerBase:
    """A WordPiece (BERT-like) or byte-level BPE (RoBERTa) tokenizer trained offline."""
    if model_type == "roberta":
        model = json.loads(_bpe_model())["model"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        return RobertaTokenizer(vocab=model["vocab"], merges=merges, model_max_length=max_length)
    return BertTokenizer(vocab=json.loads(_wordpiece_vocab()), model_max_length=max_length)
