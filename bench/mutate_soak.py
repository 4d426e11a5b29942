"""Break each rule the consolidated soak tests cover, one at a time, and run them (issue #32: no test loses what it
covered). Each mutant is one exact edit of the project's source in a scratch copy of the work tree; the gauntlet
(tests/integration/test_soak_gauntlet.py: stalls, wrong answers, a collapse, on one engine life) must fail on every
mutant that silences a verdict, and the unplanted soak (test_soak_healthy.py) on the mutant that makes the detector
see collapses in noise. The unmutated tree runs first as the control and must pass.

    .venv/bin/python -m bench.mutate_soak [--only NAME ...] [--json FILE] [--logs DIR]

Alone on the machine (the soaks are live: about 5 minutes a mutant); prints one row a mutant: killed (the test failed,
with the tests that failed) or survived. Figures in docs/testing.md#the-soak-mutation-run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GAUNTLET = "tests/integration/test_soak_gauntlet.py"
HEALTHY = "tests/integration/test_soak_healthy.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str  # what it breaks, in the words of docs/soak.md
    path: str
    old: str
    new: str
    test: str = GAUNTLET


MUTANTS = (
    Mutant(
        "no-stall",
        "a pause past the stall floor is a `stall` verdict",
        "harness/soak/figures.py",
        "if stall is None or stall < floor_s or stall < 1.5 * flagged_s:",
        "if True:",
    ),
    Mutant(
        "stall-once",
        "a longer pause is named again (pauses that grow with uptime)",
        "harness/soak/figures.py",
        "stall < 1.5 * flagged_s:",
        "(flagged_s > 0 and stall > 0):",
    ),
    Mutant(
        "no-divergence",
        "an answer unlike the canary's first one is a `divergence`",
        "harness/soak/canary.py",
        "        same, idx, method = first_difference(ref.tokens, ref.text, got.tokens, got.text)\n"
        '        vs_first = Difference(same, idx, method, "first")',
        "        same, idx, method = first_difference(ref.tokens, ref.text, ref.tokens, ref.text)\n"
        '        vs_first = Difference(same, idx, method, "first")',
    ),
    Mutant(
        "no-collapse",
        "a confirmed departure past the CUSUM threshold is a `collapse`",
        "harness/detect/changepoint.py",
        "                lv.score >= s.threshold\n",
        "                lv.score >= 1e9 * s.threshold\n",
    ),
    Mutant(
        "pause-not-excused",
        "a pause's windows are the stall verdict's, not a collapse (CI 2026-12-03)",
        "harness/detect/changepoint.py",
        "excused = 0 < self._paused_run <= self.settings.pause_windows",
        "excused = False",
    ),
    Mutant(
        "collapse-recorded",
        "a collapse stops its configuration (default action stop_config)",
        "harness/config/policy.py",
        '"collapse": "stop_config",',
        '"collapse": "record",',
    ),
    Mutant(
        "alert-never-fires",
        "the SpecsoakCollapse alert fires in Prometheus while the detector is in an episode",
        "harness/metrics/rules.py",
        'f"max by ({BY}, metric) (specsoak_soak_collapsed)",\n        "==",\n        1,',
        'f"max by ({BY}, metric) (specsoak_soak_collapsed)",\n        "==",\n        2,',
    ),
    Mutant(
        "hair-trigger",
        "a departure must pass the threshold in confirm_windows windows (no collapse from noise)",
        "harness/detect/changepoint.py",
        "                lv.score >= s.threshold\n"
        "                and len(tr.recent) == s.confirm_windows\n"
        "                and all(bad * c >= rule.min_change for _, c in tr.recent)\n",
        "                lv.score >= 0\n                and bad * (x - ref) > 0\n",
        HEALTHY,
    ),
)

SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|error|errors)(?:, \d+ \w+)*) in [\d.]+s", re.M)


def scratch_copy(dest: Path) -> None:
    """The work tree as git sees it (tracked and untracked, not ignored) into ``dest``."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for f in filter(None, files):
        src = ROOT / f.decode()
        if src.is_file():
            (dest / f.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f.decode())


def apply(tree: Path, m: Mutant) -> None:
    path = tree / m.path
    text = path.read_text()
    if text.count(m.old) != 1:
        raise SystemExit(f"{m.name}: {m.path} holds {text.count(m.old)} copies of the text to mutate, not 1")
    path.write_text(text.replace(m.old, m.new))


def run_tests(tree: Path, test: str) -> tuple[int, str, float]:
    """pytest on ``test`` in ``tree`` (its copy of the packages first on the path, the project's venv and model)."""
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", test],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - t0


def failed_tests(out: str) -> list[str]:
    return sorted(
        {ln.split()[1].split("::")[-1] for ln in out.splitlines() if ln.startswith(("FAILED tests/", "ERROR tests/"))}
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="mutant names (default: all, after the control)")
    ap.add_argument("--no-control", action="store_true", help="skip the unmutated run")
    ap.add_argument("--json", type=Path, help="write the rows here too")
    ap.add_argument("--logs", type=Path, help="write each run's pytest output here (NAME.log)")
    args = ap.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    rows: list[dict[str, object]] = []
    plan: list[Mutant | None] = ([] if args.no_control else [None]) + list(chosen)
    for i, m in enumerate(plan):
        with tempfile.TemporaryDirectory(prefix="specsoak-mutant-") as tmp:
            tree = Path(tmp)
            scratch_copy(tree)
            if m is not None:
                apply(tree, m)
            test = m.test if m is not None else f"{GAUNTLET} {HEALTHY}"
            name = m.name if m is not None else "control"
            print(f"[{i + 1}/{len(plan)}] {name}: {test}", flush=True)
            rc, out, secs = run_tests(tree, *test.split()[:1]) if m is not None else _control(tree)
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            (args.logs / f"{name}.log").write_text(out)
        summary = (SUMMARY.findall(out) or ["no summary"])[-1]
        killed = rc != 0
        row = {
            "mutant": name,
            "rule": m.rule if m is not None else "(unmutated)",
            "test": Path(test.split()[0]).name if m is not None else "gauntlet + healthy",
            "outcome": ("killed" if killed else "survived") if m is not None else ("failed" if killed else "passed"),
            "failed": failed_tests(out),
            "summary": summary,
            "seconds": round(secs),
        }
        rows.append(row)
        print(f"    {row['outcome']} in {secs:.0f} s: {summary}; failed: {', '.join(row['failed']) or '-'}", flush=True)
        if m is None and killed:
            print(out[-4000:])
            raise SystemExit("the control failed: fix the tests before reading mutants")
    print("\n| mutant | rule broken | test | outcome | failed | seconds |\n|---|---|---|---|---|---:|")
    for r in rows:
        failed = ", ".join(f"`{t}`" for t in r["failed"]) or "–"  # type: ignore[union-attr]
        print(f"| {r['mutant']} | {r['rule']} | {r['test']} | {r['outcome']} | {failed} | {r['seconds']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def _control(tree: Path) -> tuple[int, str, float]:
    rc1, out1, s1 = run_tests(tree, GAUNTLET)
    rc2, out2, s2 = run_tests(tree, HEALTHY)
    return (rc1 or rc2), out1 + out2, s1 + s2


if __name__ == "__main__":
    main()
