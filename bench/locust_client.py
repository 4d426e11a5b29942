"""The soak's Locust path (harness/load/locust_proc.py: local, or a master and workers) as one
process tree the benchmark can measure.

    python -m bench.locust_client --url http://127.0.0.1:PORT --users 64 --duration-s 8 \
        --stop-timeout-s 4 --max-tokens 128 --workers 2 --records-dir /tmp/x/locust

Steady shape, all users spawned in the first second; Locust records land in ``--records-dir``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.harness_client import prompts
from harness.load.locust_proc import LocustProcess


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--users", type=int, required=True)
    ap.add_argument("--duration-s", type=float, required=True)
    ap.add_argument("--stop-timeout-s", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--records-dir", type=Path, required=True)
    a = ap.parse_args()
    a.records_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "url": a.url,
        "chat_path": "/v1/chat/completions",
        "engine": "llamacpp",
        "extras": {"cache_prompt": False},
        "params": {
            "max_tokens": a.max_tokens,
            "temperature": 0.0,
            "seed": 42,
            "ignore_eos": True,
            "timeout_s": 600.0,
            "stall_s": 120.0,
            "keep_text": False,
        },
        "prompts": [p.to_dict() for p in prompts(max(a.users * 4, 64))],
        "shape": {"kind": "steady", "users": a.users, "spawn_rate": float(max(a.users, 1))},
        "duration_s": a.duration_s,
        "offset_s": 0.0,
        "slice_s": a.duration_s,
        "slice_id": "bench",
        "records_dir": str(a.records_dir),
        "config": "bench",
        "trace": [],
    }
    proc = LocustProcess(
        config, a.records_dir, a.records_dir / "logs", workers=a.workers, stop_timeout_s=a.stop_timeout_s
    )
    proc.start()
    try:
        proc.wait(timeout=a.duration_s + a.stop_timeout_s + 60)
    finally:
        proc.stop(grace_s=10)


if __name__ == "__main__":
    main()
