"""The service's answer as the service holds it: the wire's ChunkResponse, and what only the
service reads of it (exploring's gains), so that nothing private rides on the wire model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from chunkpilot.contract import ChunkResponse


class Gain(NamedTuple):
    """Another candidate and what measuring it is expected to save, both relative to the choice: what
    exploring weighs. Relative, so that every length of a table segment shares its end's (a plain
    tuple: an answer carries a dozen)."""

    chunk_size: int | Literal["full"]  # "full": the whole prompt, whatever its length
    ratio: float  # its predicted TTFT / the choice's
    gain: float  # the expected saving of measuring it, as a share of the choice's predicted TTFT


@dataclass(frozen=True, slots=True)
class Answer:
    response: ChunkResponse  # what the engine is sent
    gains: tuple[Gain, ...] = ()  # every other candidate, for exploring (predictor/explore.py)
