"""Train a byte-level BPE tokenizer and wrap it as a transformers tokenizer.

Byte-level BPE (GPT-2's scheme) starts from the 256 byte values, so any UTF-8 string can
be encoded with no unknown token, and merges frequent byte pairs until the vocabulary is
full. The ``tokenizers`` library does the training; the result is wrapped in
``PreTrainedTokenizerFast`` so it saves as the usual ``tokenizer.json`` +
``tokenizer_config.json`` that ``AutoTokenizer`` (and so minivllm) loads.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Ids 0 and 1 are reserved, in this order, for every tokenizer trained here.
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"


def train_byte_level_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """Train a byte-level BPE tokenizer on ``texts``; return a ``PreTrainedTokenizerFast``.

    ``<|bos|>`` is id 0 and ``<|eos|>`` id 1 (also used as the padding token). Encoding
    adds no special tokens: a prompt's ids are exactly the ids of its text, in transformers
    and in minivllm alike. Training is deterministic for the same texts in the same order.

    Args:
        texts: The training text, one document per item.
        vocab_size: Largest vocabulary size, special tokens and the 256 bytes included.

    Raises:
        ValueError: ``vocab_size`` cannot hold the special tokens and the byte alphabet.
    """
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 2:
        raise ValueError(f"vocab_size must be at least {len(alphabet) + 2}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    # No prefix space: "And God" encodes the same at the start of a prompt as after the
    # end-of-verse token in the training stream.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS_TOKEN, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN
    )
