"""The harness's own client as the runner uses it, as a process the benchmark can measure.

    python -m bench.harness_client --url http://127.0.0.1:PORT --streams 64 --requests 640 \
        --max-tokens 128 --records /tmp/x/requests.jsonl [--loops N]

Closed-loop streams through ``harness.load.client.run_streams`` with the llama.cpp adapter's request
body, records written by the same writer the runner uses (``harness.records.files.RecordSink``) to
``--records``. Prompt n is ``p<n> ...`` so the fake server can tell requests apart.
``--loops`` > 1 splits the streams over that many processes, one event loop each
(``harness.load.client.run_streams_multi``).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from urllib.parse import urlsplit

from engines.llamacpp import LlamaCpp
from engines.types import LaunchSpec
from harness.load.client import RequestParams, run_streams
from harness.prompts import Prompt


def prompts(n: int) -> list[Prompt]:
    return [
        Prompt(f"p{i}", [{"role": "user", "content": f"p{i} Write a short story about the number {i}."}])
        for i in range(n)
    ]


def engine_for(url: str) -> LlamaCpp:
    u = urlsplit(url)
    return LlamaCpp(
        LaunchSpec(model=Path("/dev/null"), host=u.hostname or "127.0.0.1", port=u.port or 80), Path("/dev/null")
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--streams", type=int, required=True)
    ap.add_argument("--requests", type=int, required=True, help="total requests (a multiple of --streams)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--records", type=Path, required=True)
    ap.add_argument("--per-record-fsync", action="store_true", help="the old writer: one write and fsync per record")
    a = ap.parse_args()
    from harness.records.files import open_request_sink

    engine = engine_for(a.url)
    per_stream = max(1, a.requests // a.streams)
    params = RequestParams(max_tokens=a.max_tokens, timeout_s=600.0, stall_s=120.0, keep_text=False)
    meta = {"config": "bench", "phase": "measure", "streams": a.streams, "repetition": 1, "attempt": "bench"}
    anchor = (time.time(), time.perf_counter_ns())
    with open_request_sink(a.records, batched=not a.per_record_fsync) as sink:
        asyncio.run(
            run_streams(
                engine,
                prompts(a.streams * per_stream),
                params,
                a.streams,
                per_stream,
                meta,
                lambda r: sink.write(r.to_dict()),
                anchor,
            )
        )


if __name__ == "__main__":
    main()
