"""The workload: one prompt to prefill, the one type that the profiler's configs, the comparison,
the stream, the demo and the closed loop hand to the engine."""

from __future__ import annotations

from dataclasses import dataclass

from chunkpilot.contract import AttentionConfig

from .global_tokens import GlobalTokens


@dataclass(frozen=True)
class Workload:
    """A prompt's words (`text`, or synthetic text of `context_length` tokens drawn from `seed`), its
    attention set-up and which of its tokens stay global. With a text, `context_length` cuts it to
    that many tokens; `global_tokens` None spreads `attention.global_tokens` evenly over the prompt."""

    context_length: int | None = None
    attention: AttentionConfig = AttentionConfig()
    global_tokens: GlobalTokens | None = None
    text: str | None = None
    seed: int = 0

    @property
    def label(self) -> str:
        length = f"{self.context_length} tok" if self.context_length is not None else "text"
        return f"{length}, {self.attention.label}"
