"""A plain Locust user with Locust's own rate mode, ``constant_pacing``: the peer the harness's open-loop client is
compared with (bench/open_loop.py). U users each start a request every U / R seconds, so together they offer R
requests per second; a request that takes longer than the pacing delays that user's next one (Locust does not count
it as late). bench/open_loop.py spawns the users at R per second so that their grids could interleave; Locust
starts each second's users together, so the aggregate arrives in bursts of about R once a second: its own rate
mode offers the mean rate, not the spacing. Run in Locust's own process:

    BENCH_PACING_S=0.5 BENCH_MAX_TOKENS=32 locust -f bench/locust_pacing.py --headless -u 10 -r 10 -t 10s --host URL
"""

from __future__ import annotations

import itertools
import os

from locust import FastHttpUser, constant_pacing, task

_N = itertools.count()


class PacedChat(FastHttpUser):
    wait_time = constant_pacing(float(os.environ.get("BENCH_PACING_S", "1")))

    @task
    def chat(self) -> None:
        i = next(_N)
        body = {
            "model": "fake-model",
            "stream": True,
            "max_tokens": int(os.environ.get("BENCH_MAX_TOKENS", "32")),
            "messages": [{"role": "user", "content": f"l{i} Write a short story about the number {i}."}],
        }
        self.client.post("/v1/chat/completions", json=body, name="chat")  # the whole streamed body is read
