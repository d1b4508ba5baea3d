"""A byte-level BPE tokenizer trained locally on the task's text (``tokenizers``; no download).

Digits are split one per token before BPE (``Digits(individual_digits=True)``), so a number is always its
digit sequence and the arithmetic stays learnable; the operators and frequent pairs get merges. Two special
tokens: ``<|pad|>`` (id 0) and ``<|eos|>`` (id 1). The tokenizer is saved next to each run
(``tokenizer.json``) and in the warm-start cache, and reloads with :func:`load_tokenizer`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PAD = "<|pad|>"
EOS = "<|eos|>"
TOKENIZER_FILE = "tokenizer.json"


class TaskTokenizer:
    """Thin wrapper: encode/decode plus the special ids the pipeline needs."""

    def __init__(self, tok: Any) -> None:
        self._tok = tok
        self.pad_id = int(tok.token_to_id(PAD))
        self.eos_id = int(tok.token_to_id(EOS))

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` up to (not including) the first end-of-sequence token."""
        ids = list(ids)
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self._tok.decode(ids, skip_special_tokens=True)

    def save(self, directory: str | os.PathLike[str]) -> Path:
        path = Path(directory) / TOKENIZER_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(path))
        return path


def train_tokenizer(texts: Sequence[str], vocab_size: int = 512) -> TaskTokenizer:
    """Train the byte-level BPE on ``texts``; deterministic for identical input."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 260:
        raise ValueError(f"vocab_size must be >= 260 (256 bytes + specials), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    return TaskTokenizer(tok)


def load_tokenizer(directory: str | os.PathLike[str]) -> TaskTokenizer:
    from tokenizers import Tokenizer

    path = Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(2, "no tokenizer saved here", str(path))
    return TaskTokenizer(Tokenizer.from_file(str(path)))
