"""`auto` for stock transformers users: a checkpoint loaded with `from_pretrained`, its
`generate(..., prefill_chunk_size=...)` given ChunkPilot's decision, with the same tokens as
without chunking, and the engine's fallback when the service cannot answer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM

from auto.hf import auto_policy, chunked_generate, prefill_chunk_size
from chunkpilot.contract import ChunkRequest, Decision
from cli.processes import free_port
from engine.models import load_model
from engine.policy import RulePolicy


@dataclass
class Asked:
    """The hand rule, keeping the request it was asked about (a test double)."""

    name: str = "asked"
    requests: list[ChunkRequest] = field(default_factory=list)

    def decide(self, request: ChunkRequest) -> Decision:
        self.requests.append(request)
        return RulePolicy().decide(request)


def test_generate_with_auto_gives_the_same_tokens_as_one_shot(tmp_path, trained_store):
    load_model("llama-tiny").model.save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)  # as a stock user loads it
    ids = torch.randint(0, model.config.vocab_size, (1, 700), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    plain = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    out, decision = chunked_generate(
        model, inputs, auto_policy(model, trained_store), max_new_tokens=3, do_sample=False
    )
    assert decision.source == "in-process" and 1 <= decision.chunk_size <= 700
    assert torch.equal(out, plain)
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens: the rule, with the reason
    out, decision = chunked_generate(model, inputs, auto_policy(model, nobody), max_new_tokens=3, do_sample=False)
    assert decision.source == "fallback" and "refused" in decision.reason and torch.equal(out, plain)


def test_the_model_s_config_becomes_the_request():
    mistral = load_model("mistral-44m").model  # its own sliding window, 1024
    asked = Asked()
    assert prefill_chunk_size(mistral, 3000, asked).chunk_size == RulePolicy().decide(asked.requests[0]).chunk_size
    request = asked.requests[0]
    assert request.context_length == 3000 and request.attention.window == 1024 and request.attention.layout == "shift"
    assert request.shape.num_layers == mistral.config.num_hidden_layers and request.dtype == "float32"
    assert request.backend == "transformers"  # decided from stock generate's costs, not the engine's
