"""A stream of prompts: request k+1 is prepared (tokenized, its chunk decided) while request k
prefills, without changing any result, and `chunkpilot prefill --prompts` serves a JSON-lines file."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import pytest
import torch

from chunkpilot.contract import AttentionConfig, ChunkRequest, Decision
from cli import main
from engine.policy import ChunkPolicy, RulePolicy
from engine.stream import stream
from engine.workload import Workload


@dataclass
class RecordingRule(ChunkPolicy):
    """The hand rule, noting when and on which thread each decision was asked (a test double)."""

    name: str = "recording-rule"
    asked: list[tuple[int, str, float]] = field(default_factory=list)  # (context length, thread, time)

    def decide(self, request: ChunkRequest) -> Decision:
        self.asked.append((request.context_length, threading.current_thread().name, time.perf_counter()))
        return RulePolicy().decide(request)


NO_WINDOW = AttentionConfig()


def requests(lengths: list[int], attention: AttentionConfig = NO_WINDOW) -> list[Workload]:
    return [Workload(n, attention, seed=i) for i, n in enumerate(lengths)]


@pytest.mark.parametrize("attention", [NO_WINDOW, AttentionConfig(window=64, layout="ring")])
def test_overlap_changes_no_result(engines, attention):
    engine = engines("llama-tiny")
    batch = requests([300, 120, 500, 64], attention)
    alone = [engine.run(w, RulePolicy()) for w in batch]
    for overlap in (False, True):
        streamed = list(stream(engine, batch, RulePolicy(), overlap))
        assert [r.chunk_size for r in streamed] == [r.chunk_size for r in alone]
        for got, want in zip(streamed, alone, strict=True):
            assert got.first_token == want.first_token
            torch.testing.assert_close(got.first_logits, want.first_logits)


def test_the_next_request_is_prepared_during_the_current_prefill(engines):
    engine = engines("llama-tiny")
    batch = requests([400, 300, 200])
    policy, yielded = RecordingRule(), []
    for result in stream(engine, batch, policy, overlap=True):
        yielded.append(time.perf_counter())
        assert result.ttft_ms >= result.prefill_ms + result.first_decode_ms
    assert [n for n, _, _ in policy.asked] == [400, 300, 200]
    assert {thread for _, thread, _ in policy.asked} == {"chunkpilot-prepare_0"}  # off the main thread
    for k in (1, 2):  # asked before the previous request had its first token: hidden behind its prefill
        assert policy.asked[k][2] < yielded[k - 1]

    policy = RecordingRule()
    list(stream(engine, batch, policy, overlap=False))
    assert {thread for _, thread, _ in policy.asked} == {threading.current_thread().name}


def test_prompts_file_streams_each_line(capsys, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    lines = [
        {"context_length": 200, "seed": 1},
        {"text": "a short prompt about sliding windows"},
        {"context_length": 90},
    ]
    prompts.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    argv = ["prefill", "--model", "llama-tiny", "--threads", "2", "--chunk-size", "64", "--prompts", str(prompts)]
    assert main([*argv, "--json"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["request"] for o in out] == [1, 2, 3] and all(o["overlap"] for o in out)
    assert [o["context_length"] for o in out][::2] == [200, 90] and all(o["chunk_size"] <= 64 for o in out)
    assert main([*argv, "--no-overlap"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert "overlap off" in table[0] and len(table) == 4


@pytest.mark.parametrize(
    "line, field_name",
    [
        ('{"context_length": 0}', "prompts line 2: context_length"),
        ("{}", "prompts line 2: text"),
        ("[1]", "prompts line 2"),
        ("not json", "prompts line 2"),
        ('{"txt": "x"}', "prompts line 2: txt"),
    ],
)
def test_a_bad_prompts_line_is_named(capsys, tmp_path, line, field_name):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"context_length": 50}\n' + line + "\n")
    assert main(["prefill", "--model", "llama-tiny", "--prompts", str(prompts)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and field_name in err and "Traceback" not in err, err
