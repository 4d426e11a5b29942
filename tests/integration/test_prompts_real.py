"""Realistic prompts on the real llama-server (issue #17): lengths counted by the server's own /tokenize, prompts
built at drawn lengths with a shared prefix, answers as long as drawn, and no prompt sent twice in a phase."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engines.llamacpp import LlamaCpp
from harness.config.schema import Lengths
from harness.prompts import load_prompts
from harness.prompts.lengths import build
from harness.records.files import read_jsonl
from tests.integration.conftest import SMOLLM2, run_scenario

pytestmark = pytest.mark.engine


def test_the_servers_tokenizer_counts_the_built_prompts(self_draft_server: LlamaCpp) -> None:
    engine = self_draft_server
    ids = engine.tokenize("def main():\n    return 42\n")
    assert 5 <= len(ids) <= 20 and engine.detokenize(ids) == "def main():\n    return 42\n"
    source = load_prompts("builtin:conversations", Path("."))[:40]
    lengths = Lengths.model_validate(
        {"input": {"dist": "lognormal", "mean": 120, "sd": 60, "min": 16, "max": 400}, "seed": 2}
    )
    b = build(source, lengths, 25, engine)
    assert b.counted_in == "tokens"
    # each built text, tokenized again by the server, is as long as drawn (the builder adjusts the window until it is)
    exact = sum(got == want for got, want in zip(b.input_tokens, b.input_drawn, strict=True))
    assert exact >= 23 and all(abs(got - want) <= 2 for got, want in zip(b.input_tokens, b.input_drawn, strict=True)), (
        list(zip(b.input_tokens, b.input_drawn, strict=True))
    )
    assert [len(engine.tokenize(p.messages[0]["content"])) for p in b.prompts] == b.input_tokens
    assert len({p.messages[0]["content"] for p in b.prompts}) == 25


def test_a_phase_at_drawn_lengths_with_a_shared_prefix_sends_each_prompt_once(tmp_path: Path) -> None:
    data = {
        "name": "lengths",
        "server": {"model": SMOLLM2, "ctx_size": 4096, "parallel": 2, "threads": 2},
        "configurations": [{"name": "baseline", "algorithm": "none"}],
        "measurement": {
            "prompts": "builtin:conversations",
            "max_tokens": 64,
            "streams": [1, 2],
            "requests_per_stream": 2,
            "repetitions": 1,
            "warmup_requests": 0,
            "prompt_reuse": "forbid",
            "lengths": {
                "input": {"dist": "uniform", "min": 40, "max": 160},
                "output": {"dist": "uniform", "min": 4, "max": 24},
                "shared_prefix_tokens": 64,
                "seed": 7,
            },
        },
    }
    run = run_scenario(data, tmp_path, timeout=600)
    built_files = list((run / "prompts").glob("measurement-*.jsonl"))
    assert len(built_files) == 1
    lines = [json.loads(x) for x in built_files[0].read_text().splitlines()]
    assert lines[0]["_meta"] == {"counted_in": "tokens", "prefix_tokens": 64}
    built = {b["id"]: b for b in lines[1:]}
    assert len(built) == 6  # (1 + 2) streams x 2 requests
    reqs = [r for r in read_jsonl(run / "requests.jsonl") if r["phase"] == "measure"]
    assert len(reqs) == 6 and all(r["status"] == "ok" for r in reqs)
    for r in reqs:  # ignore_eos: every answer is as long as its drawn max_tokens
        assert r["output_tokens"] == built[r["prompt_id"]]["max_tokens"]
    # the prompt the server counted is the drawn input plus the same overhead for all (prefix, chat template), give or take
    overhead = [r["prompt_tokens"] - built[r["prompt_id"]]["input_drawn"] for r in reqs]
    assert max(overhead) - min(overhead) <= 4 and min(overhead) >= 64, overhead
    phases = list(read_jsonl(run / "phases.jsonl"))
    assert [p["distinct_prompts"] for p in phases] == [p["requests"] for p in phases] == [2, 4]
    assert len({r["prompt_id"] for r in reqs}) == 6  # the two phases took different prompts too
    subprocess.run(
        [sys.executable, "-m", "harness.cli", "report", str(run)], check=True, capture_output=True, timeout=300
    )
    prompts_csv = (run / "prompts.csv").read_text().splitlines()
    assert prompts_csv[0] == "run,config,phase,load,repetition,requests,distinct_prompts,repeated"
    assert [row.split(",")[-3:] for row in prompts_csv[1:]] == [["2", "2", "0"], ["4", "4", "0"]]


def test_a_soak_that_forbids_reuse_sends_each_prompt_once_and_says_when_they_run_out(tmp_path: Path) -> None:
    convs = [
        {
            "id": f"c{i}",
            "messages": [{"role": "user", "content": f"Count from {i} to {i + 5}."}],
            "followups": ["Now backwards."] if i % 2 else [],
        }
        for i in range(4)
    ]
    (tmp_path / "four.jsonl").write_text("".join(json.dumps(c) + "\n" for c in convs))
    data = {
        "name": "noreuse",
        "server": {"model": SMOLLM2, "ctx_size": 2048, "parallel": 2, "threads": 2, "stop_grace_s": 3},
        "configurations": [{"name": "baseline", "algorithm": "none"}],
        "measurement": {
            "prompts": "builtin:conversations",
            "max_tokens": 8,
            "streams": [1],
            "requests_per_stream": 1,
            "repetitions": 1,
            "warmup_requests": 0,
        },
        # 2 users x 20 s of 8-token answers: far more than 4 conversations' worth (6 requests) on this CPU
        "soak": {
            "duration_s": 20,
            "shape": {"kind": "steady", "users": 2},
            "prompts": "four.jsonl",
            "max_tokens": 8,
            "prompt_reuse": "forbid",
            "watchdog": {"window_s": 5},
        },
    }
    run = run_scenario(data, tmp_path, timeout=600)
    recs = [r for f in sorted((run / "soak").glob("*.jsonl")) for r in read_jsonl(f)]
    sent = [(r["prompt_id"], r["turn"]) for r in recs]
    assert sorted(sent) == [("c0", 0), ("c1", 0), ("c1", 1), ("c2", 0), ("c3", 0), ("c3", 1)]  # each once, then nothing
    marker = list((run / "soak").glob("*.exhausted"))
    assert len(marker) == 1 and json.loads(marker[0].read_text())["prompts"] == 4


def test_a_soak_at_drawn_lengths_keeps_the_corpus_conversations_turns_and_answer_lengths(tmp_path: Path) -> None:
    data = {
        "name": "soaklengths",
        "server": {"model": SMOLLM2, "ctx_size": 2048, "parallel": 2, "threads": 2, "stop_grace_s": 3},
        "configurations": [{"name": "baseline", "algorithm": "none"}],
        "measurement": {
            "prompts": "builtin:conversations",
            "max_tokens": 8,
            "streams": [1],
            "requests_per_stream": 1,
            "repetitions": 1,
            "warmup_requests": 0,
        },
        "soak": {
            "duration_s": 20,
            "shape": {"kind": "steady", "users": 2},
            "prompts": "builtin:conversations",
            "max_tokens": 64,
            "prompt_reuse": "forbid",
            "watchdog": {"window_s": 5},
            "lengths": {
                "input": {"dist": "fixed", "mean": 48},
                "output": {"dist": "uniform", "min": 4, "max": 12},
                "prompts": 6,
                "seed": 3,
            },
        },
    }
    run = run_scenario(data, tmp_path, timeout=600)
    built_file = next((run / "prompts").glob("soak-*.jsonl"))
    built = {b["id"]: b for b in (json.loads(x) for x in built_file.read_text().splitlines()[1:])}
    assert len(built) == 6 and all(b["input_tokens"] == 48 for b in built.values())
    recs = [r for f in sorted((run / "soak").glob("*.jsonl")) for r in read_jsonl(f)]
    sent = sorted((r["prompt_id"], r["turn"]) for r in recs)
    want = sorted((pid, t) for pid, b in built.items() for t in range(1 + len(b["followups"])))
    assert sent == want and any(t > 0 for _, t in sent)  # every turn of every built conversation, once
    assert all(r["output_tokens"] == built[r["prompt_id"]]["max_tokens"] for r in recs if r["status"] == "ok")
