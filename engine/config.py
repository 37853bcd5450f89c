"""The engine's configuration, light (torch is imported only to check a device), so that the CLI
builds its options from these fields without loading torch for --help."""

from __future__ import annotations

from pydantic import Field, model_validator

from chunkpilot.contract import AttnImpl, Backend, ConfigError, Contract, Dtype


class EngineConfig(Contract):
    model: str = Field(default="mistral-44m", description="preset, checkpoint folder or JSON/YAML shape file")
    dtype: Dtype = Field(default="float32", description="the weights' and activations' dtype")
    threads: int | None = Field(default=None, ge=1, le=1024, description="torch threads (default: every core)")
    attn_impl: AttnImpl = Field(
        default="sdpa",
        description="attention: sdpa (dense mask, transformers' sdpa), eager (the model's own), "
        "split (only the visible blocks, merged by log-sum-exp; this engine on cpu)",
    )
    device: str = Field(default="cpu", description="cpu or cuda")
    seed: int = Field(default=0, ge=0, description="seed of random weights (presets and shape files)")
    compile: bool = Field(default=False, description="torch.compile the model (dynamic shapes; the warm-up compiles)")
    backend: Backend = Field(
        default="chunkpilot",
        description="what runs the prefill: chunkpilot (this engine), transformers (stock generate), "
        "llama.cpp (a llama_cpp.Llama context on the same weights, written to GGUF)",
    )

    @model_validator(mode="after")
    def _device_present(self) -> EngineConfig:
        if self.attn_impl == "split" and (self.backend != "chunkpilot" or self.device != "cpu"):
            raise ConfigError(
                "attn_impl",
                f"split runs in the chunkpilot backend on cpu (its kernel is torch's CPU flash "
                f"attention); for backend {self.backend} on {self.device} use sdpa or eager",
            )
        if self.device == "cpu":
            return self
        import torch  # only for another device: the CPU path never needs it here

        if not (self.device.startswith("cuda") and torch.cuda.is_available()):
            raise ConfigError(
                "device", f"must be cpu{' or cuda' if torch.cuda.is_available() else ''}; got {self.device!r}"
            )
        return self
