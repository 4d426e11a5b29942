"""The harness's open-loop client as the runner uses it (``harness.load.arrivals.run_arrivals``), as a process the
benchmark can measure: ``--requests`` requests at a constant ``--rate``, no cap on requests in flight.

    python -m bench.harness_arrivals --url http://127.0.0.1:PORT --rate 20 --requests 100 --max-tokens 32 \
        --records /tmp/x/requests.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from bench.harness_client import engine_for, prompts
from harness.load.client import RequestParams
from harness.load.schedule import rate_schedule


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-in-flight", type=int, default=65_536)
    ap.add_argument("--records", type=Path, required=True)
    a = ap.parse_args()
    from harness.load.arrivals import run_arrivals
    from harness.records.files import open_request_sink

    sched = rate_schedule("constant", a.rate, a.requests, seed=0)
    params = RequestParams(max_tokens=a.max_tokens, timeout_s=600.0, stall_s=120.0, keep_text=False)
    meta = {"config": "bench", "phase": "arrivals", "streams": a.max_in_flight, "repetition": 1, "attempt": "bench"}
    anchor = (time.time(), time.perf_counter_ns())
    with open_request_sink(a.records, batched=True) as sink:
        asyncio.run(
            run_arrivals(
                engine_for(a.url),
                prompts(a.requests),
                params,
                sched.offsets_s.tolist(),
                a.max_in_flight,
                meta,
                lambda r: sink.write(r.to_dict()),
                anchor,
            )
        )


if __name__ == "__main__":
    main()
