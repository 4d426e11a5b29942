"""A soak's records as a replay fixture: what the detector reads, trimmed, into tests/fixtures/soak_records/NAME/.

    .venv/bin/python -m bench.soak_fixture RUN_DIR NAME

Copies the run's ``scenario.yaml``, ``windows.jsonl`` and ``verdicts.jsonl`` as written (the rules replay the windows,
tests/unit/test_watchdog_rules.py), and reduces its soak request records to the fields that say when each request ran
and how fast it decoded (``requests.jsonl``: the decode of requests that ran alone is rebuilt from them). `make
soak-check` runs it after the long soak; the fixture is then named in the replay test with the verdicts it must give.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from harness.records.files import SOAK_DIR, VERDICTS, WINDOWS, read_jsonl

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "soak_records"
REQUEST_FIELDS = (
    "config",
    "status",
    "start_unix_s",
    "ttft_s",
    "e2e_s",
    "output_tokens",
    "decode_tps",
    "prompt_tokens",  # with cached_tokens: the prefill index's prompt term (harness/soak/prefill.py)
    "cached_tokens",
)


def make_fixture(run_dir: Path, out: Path) -> dict[str, int]:
    """Write the fixture; how many windows, verdicts and requests it holds."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("scenario.yaml", WINDOWS, VERDICTS):
        src = run_dir / name
        if not src.exists():
            raise SystemExit(f"{src}: not in the run folder (a soak run's folder holds it)")
        shutil.copyfile(src, out / name)
    requests = sorted(
        (
            {k: r.get(k) for k in REQUEST_FIELDS}
            for f in sorted((run_dir / SOAK_DIR).glob("*.jsonl"))
            for r in read_jsonl(f)
        ),
        key=lambda r: (str(r["config"]), float(r["start_unix_s"] or 0.0)),
    )
    with open(out / "requests.jsonl", "w") as f:
        f.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in requests)
    count = lambda p: sum(1 for _ in read_jsonl(p))
    return {"windows": count(out / WINDOWS), "verdicts": count(out / VERDICTS), "requests": len(requests)}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    run_dir, name = Path(argv[0]), argv[1]
    got = make_fixture(run_dir, FIXTURES / name)
    print(f"{FIXTURES / name}: {got['windows']} windows, {got['verdicts']} verdicts, {got['requests']} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
