"""Which tokens stay global (selective SWA): positions, token ids or text markers, resolved against
a prompt's token ids before its prefill. Sinks are the special case "the first S tokens"."""

from __future__ import annotations

from dataclasses import dataclass

from chunkpilot.contract import MAX_GLOBAL_TOKENS, ConfigError, number


@dataclass(frozen=True)
class GlobalTokens:
    positions: tuple[int, ...] = ()
    token_ids: tuple[int, ...] = ()
    markers: tuple[str, ...] = ()  # text whose every occurrence (all its tokens) becomes global

    @classmethod
    def parse(cls, values: list[str]) -> GlobalTokens:
        """`--global-tokens` values: `0,17,42` (positions), `id:5` (a token id) or `text:Question:`."""
        positions, ids, markers = [], [], []
        for value in values:
            if value.startswith("text:") and len(value) > 5:
                markers.append(value[5:])
            elif value.startswith("id:"):
                ids.append(number("global_tokens", value[3:], int, ge=0))
            else:
                try:
                    positions += [number("global_tokens", v.strip(), int, ge=0) for v in value.split(",")]
                except ConfigError:
                    raise ConfigError(
                        "global_tokens", f"give positions like 0,17,42, id:TOKEN_ID or text:MARKER; got {value!r}"
                    ) from None
        return cls(tuple(positions), tuple(ids), tuple(markers))

    def resolve(self, ids: list[int], encode) -> list[int]:
        """Sorted positions within the prompt `ids`; `encode(text) -> token ids` finds the markers
        (as encoded alone, and after a space, the way they usually sit in a text)."""
        found = {p for p in self.positions if p < len(ids)}
        found |= {i for i, t in enumerate(ids) if t in self.token_ids}
        for marker in self.markers:
            for pattern in {tuple(encode(marker)), tuple(encode(" " + marker))} - {()}:
                k = len(pattern)
                found |= {i + j for i in range(len(ids) - k + 1) if tuple(ids[i : i + k]) == pattern for j in range(k)}
        if len(found) > MAX_GLOBAL_TOKENS:
            raise ConfigError("global_tokens", f"at most {MAX_GLOBAL_TOKENS} per prompt; this one has {len(found)}")
        return sorted(found)
