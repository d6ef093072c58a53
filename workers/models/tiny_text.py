"""Offline tokenizers for the tiny text models: vocabularies shipped beside this module.

Every process, driver and worker alike, reads the same bytes, so a tiny text model tokenizes
identically everywhere (issue 34, item 13: a WordPiece vocabulary trained at run time came out
in another order in each process, its ids following the trainer's hash-map order).
`tokenizer_digest` is the sha256 of those bytes: the model's fingerprint covers it.

How the files were made (tokenizers 0.23.3, CPython 3.11.7's `pydoc_data.topics`, every topic
in sorted key order, vocabulary size 1000):
  tiny_wordpiece.txt  `BertWordPieceTokenizer(lowercase=True).train_from_iterator(...)` with
                      special tokens BERT_SPECIALS; one token a line (id = line number): the
                      specials first, then the other 995 tokens in code-point order (the trained
                      set, which is the same in every process; its order is not).
  tiny_bpe.json       `ByteLevelBPETokenizer().train_from_iterator(...)` with ROBERTA_SPECIALS:
                      its `vocab` (token -> id) and `merges` ("a b") as trained (deterministic:
                      the files reproduce what tiny-roberta tokenized with before).
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
VOCABULARIES = {"roberta": "tiny_bpe.json"}
"""Model type -> its vocabulary file beside this module; every other type is WordPiece."""
WORDPIECE = "tiny_wordpiece.txt"
TOKENIZER_BEFORE_DIGESTS = {
    "roberta": "sha256:01deafbbc2d2ee50f615dbef43ee46171cbe1e9f91de5bcd6272515824f2d1d7",
}
"""Digests left out of a model's fingerprint (`fingerprint_entry`): the tokenizer every store
made before the digest was fingerprinted already used (byte-level BPE trained the same in every
process), so those stores keep their fingerprint. WordPiece has none: its old stores may hold
shards tokenized with different vocabularies and are refused."""


def _file(model_type: str) -> Path:
    return Path(__file__).with_name(VOCABULARIES.get(model_type, WORDPIECE))


@cache
def _vocabulary_bytes(model_type: str) -> bytes:
    return _file(model_type).read_bytes()


def tokenizer_digest(model_type: str) -> str:
    """`sha256:<hex>` of the vocabulary file the tiny tokenizer of `model_type` reads."""
    return "sha256:" + hashlib.sha256(_vocabulary_bytes(model_type)).hexdigest()


def fingerprint_entry(pretrained: bool, modality: str, model_type: str) -> dict[str, str]:
    """`{"tokenizer": digest}` for a tiny text model (an hf text model built from its config:
    its tokenizer is this module's), `{}` for any other model (a pretrained model's tokenizer is
    its checkpoint's) or when the digest is in TOKENIZER_BEFORE_DIGESTS."""
    if pretrained or modality != "text":
        return {}
    digest = tokenizer_digest(model_type)
    if TOKENIZER_BEFORE_DIGESTS.get(model_type) == digest:
        return {}
    return {"tokenizer": digest}


def tiny_tokenizer(model_type: str, max_length: int) -> PreTrainedTokenizerBase:
    """A byte-level BPE (RoBERTa) or WordPiece (BERT-like) tokenizer from the shipped files."""
    from transformers import BertTokenizer, RobertaTokenizer

    text = _vocabulary_bytes(model_type).decode("utf-8")
    if model_type in VOCABULARIES:
        model = json.loads(text)
        merges = [tuple(merge.split(" ")) for merge in model["merges"]]
        return RobertaTokenizer(vocab=model["vocab"], merges=merges, model_max_length=max_length)
    vocab = {token: index for index, token in enumerate(text.splitlines())}
    return BertTokenizer(vocab=vocab, model_max_length=max_length)
