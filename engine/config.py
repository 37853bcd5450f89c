"""The engine's configuration, light (torch is imported only to check a device), so that the CLI
builds its options from these fields without loading torch for --help."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from chunkpilot.contract import (
    MAX_MEMORY_MB,
    AttnImpl,
    Backend,
    ConfigError,
    Contract,
    Dtype,
    Quant,
    check_attn_impl,
    default_attn_impl,
)


class EngineConfig(Contract):
    model: str = Field(default="mistral-44m", description="preset, checkpoint folder or JSON/YAML shape file")
    dtype: Dtype = Field(default="float32", description="the weights' and activations' dtype")
    threads: int | None = Field(default=None, ge=1, le=1024, description="torch threads (default: every core)")
    attn_impl: AttnImpl | None = Field(
        default=None,
        description="attention: split (only the visible key blocks, merged by log-sum-exp; the default of this "
        "engine on cpu), masked (a dense mask through PyTorch's SDPA; the default elsewhere), eager (the model's own)",
    )
    device: str = Field(default="cpu", description="cpu or cuda")
    seed: int = Field(default=0, ge=0, description="seed of random weights (presets and shape files)")
    compile: bool = Field(default=False, description="torch.compile the model (dynamic shapes; the warm-up compiles)")
    backend: Backend = Field(
        default="chunkpilot",
        description="what runs the prefill: chunkpilot (this engine), transformers (stock generate), "
        "llama.cpp (a llama_cpp.Llama context on the same weights, written to GGUF)",
    )
    quant: Quant = Field(
        default="f32", description="llama.cpp: the GGUF's weights, f32 or quantised by llama.cpp's own quantizer"
    )
    memory_budget_mb: float | None = Field(
        default=None,
        gt=0,
        le=MAX_MEMORY_MB,
        description="auto: the most memory a prefill may add above the loaded model, MB; the fastest size predicted "
        "to fit is chosen, and a prompt none fits is refused (`chunkpilot hardware --available-memory` says what "
        "this machine has free)",
    )

    @model_validator(mode="before")
    @classmethod
    def _kernel_for_where_it_runs(cls, data: Any) -> Any:
        """Unless given, the attention kernel is the one that runs on that backend and device."""
        if isinstance(data, dict) and data.get("attn_impl") is None:  # None: not given
            device = "cpu" if str(data.get("device", "cpu")) == "cpu" else "cuda"
            return {**data, "attn_impl": default_attn_impl(data.get("backend", "chunkpilot"), device)}
        return data

    @model_validator(mode="after")
    def _device_present(self) -> EngineConfig:
        check_attn_impl(self.attn_impl, self.backend, "cpu" if self.device == "cpu" else "cuda")
        if self.quant != "f32" and self.backend != "llama.cpp":
            raise ConfigError("quant", f"only the llama.cpp backend runs quantised weights; got {self.quant}")
        if self.device == "cpu":
            return self
        import torch  # only for another device: the CPU path never needs it here

        if not (self.device.startswith("cuda") and torch.cuda.is_available()):
            raise ConfigError(
                "device", f"must be cpu{' or cuda' if torch.cuda.is_available() else ''}; got {self.device!r}"
            )
        return self
