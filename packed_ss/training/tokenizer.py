"""Byte-level BPE tokenizer for the embedded model, trained with ``tokenizers`` on the stdlib corpus.

The GPT-2 style pre-tokenizer keeps runs of spaces together, so indentation becomes single tokens. The
result is saved as a ``PreTrainedTokenizerFast`` folder that ``transformers.AutoTokenizer`` loads.
"""

from __future__ import annotations

from collections.abc import Iterable

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
PAD_TOKEN = "<|pad|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE tokenizer.

    Args:
        texts: training documents.
        vocab_size: total vocabulary including the three special tokens.
    Returns:
        a ``transformers.PreTrainedTokenizerFast`` with ``eos_token``, ``mask_token`` and ``pad_token`` set.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, MASK_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        mask_token=MASK_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
    )
