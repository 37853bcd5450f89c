"""An offline tokenizer: byte-level BPE trained here on a corpus shipped in the repo, or the
checkpoint's own `tokenizer.json`; and synthetic prompts of a target token count."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from chunkpilot.contract import ConfigError

CORPUS = Path(__file__).parent / "assets" / "corpus.txt"
MAX_TRAINED_VOCAB = 8192
MIN_VOCAB = 512  # the byte alphabet plus room for merges


@lru_cache(maxsize=8)
def trained_tokenizer(vocab_size: int) -> Tokenizer:
    """Byte-level BPE over the shipped corpus: the same vocabulary every time for the same size."""
    if vocab_size < MIN_VOCAB:
        raise ConfigError("vocab_size", f"must be >= {MIN_VOCAB} for the built-in tokenizer; got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, MAX_TRAINED_VOCAB),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_paragraphs(), trainer=trainer)
    return tokenizer


def load_tokenizer(checkpoint: Path | None, vocab_size: int) -> Tokenizer:
    """The checkpoint's tokenizer.json when it has one, else the trained one."""
    if checkpoint is not None and (checkpoint / "tokenizer.json").is_file():
        try:
            return Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises a bare Exception for a broken file
            raise ConfigError("model", f"cannot read {checkpoint / 'tokenizer.json'}: {exc}") from None
    return trained_tokenizer(vocab_size)


@lru_cache(maxsize=1)
def corpus_paragraphs() -> tuple[str, ...]:
    return tuple(p for p in CORPUS.read_text().split("\n\n") if p.strip())


def synthetic_text(tokenizer: Tokenizer, context_length: int, seed: int = 0) -> str:
    """Corpus paragraphs from a seeded offset, cut just past `context_length` tokens."""
    paragraphs = corpus_paragraphs()
    parts: list[str] = []
    i = seed * 7919 % len(paragraphs)
    while True:
        # ~4 characters per token; grow until the text has enough tokens
        while sum(len(p) for p in parts) < 5 * context_length + 64:
            parts.append(paragraphs[i % len(paragraphs)])
            i += 1
        text = "\n\n".join(parts)
        encoding = tokenizer.encode(text)
        if len(encoding.ids) > context_length:
            return text[: encoding.offsets[context_length][1]]
        parts.append(paragraphs[i % len(paragraphs)])
        i += 1
