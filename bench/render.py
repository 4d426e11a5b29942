"""Tables and plots for docs/performance.md, from the benchmarks' results.json alone."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

PEER_PREFIXES = ("GuideLLM", "AIPerf", "vllm bench serve")


def _f(x: Any, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, (int, float)) and x == x else "–"


def _is_peer(client: str) -> bool:
    return client.startswith(PEER_PREFIXES)


def render_client_overhead(data: dict[str, Any], png: Path) -> tuple[str, Path]:
    rows = list(data["results"])
    best_peer: dict[int, float] = {}
    for r in rows:
        v = r.get("cpu_s_per_1k_tokens")
        if _is_peer(r["client"]) and v and not r.get("note"):
            best_peer[r["streams"]] = min(best_peer.get(r["streams"], float("inf")), v)
    lines = [
        "| client | streams | CPU s / 1k tokens | vs best peer | client cores during run | peak RSS MiB | achieved streams | tokens | failed | "
        "TTFT err p50 / p99 ms | ITL err p50 / p99 ms | per-chunk err p50 / p99 ms | ITL p99 true / reported ms | other cores | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["streams"], r["client"])):
        bp = best_peer.get(r["streams"])
        v = r.get("cpu_s_per_1k_tokens")
        ratio = f"{v / bp:.2f}×" if v and bp else "–"
        note = r.get("note") or ""
        if r.get("itl_kind") and r["itl_kind"] != "per chunk":
            note = (note + "; " if note else "") + f"ITL {r['itl_kind']}"
        lines.append(
            f"| {r['client']} | {r['streams']} | {_f(v, '.3f')} | {ratio} | {_f(r.get('client_cores'), '.3f')} | {_f(r['peak_rss_mib'], '.0f')} | "
            f"{r['achieved_streams']} | {r['tokens']:,} | {r['failed'] if r['failed'] is not None else '–'} | "
            f"{_f(r['ttft_err_p50_ms'], '.2f')} / {_f(r['ttft_err_p99_ms'], '.2f')} | "
            f"{_f(r['itl_err_p50_ms'], '.2f')} / {_f(r['itl_err_p99_ms'], '.2f')} | "
            f"{_f(r['chunk_err_p50_ms'], '.3f')} / {_f(r['chunk_err_p99_ms'], '.3f')} | "
            f"{_f(r['itl_p99_true_ms'], '.1f')} / {_f(r['itl_p99_reported_ms'], '.1f')} | "
            f"{_f(r['other_cores'], '.2f')}{' ⚠' if r['contaminated'] else ''} | {note} |"
        )
    env = data.get("env", {})
    head = [
        f"Load average at the start: {env.get('load_avg', [0])[0]:.2f}; other engineers' heavy processes then: "
        f"{len(env.get('busy_processes', []))}. `other cores` is every other process's CPU during the measurement; ⚠ marks "
        f"more than 0.05 cores (contaminated).",
    ]
    for client, why in (data.get("skipped") or {}).items():
        head.append(f"Skipped `{client}`: {why}.")
    levels = data.get("levels", {})
    head.append(
        "Server schedules (TTFT, ITL, a 4× ITL stall every 32nd gap): "
        + "; ".join(
            f"{n}: {lv['requests']} requests × {lv['max_tokens']} tokens, TTFT {lv['ttft_ms']:g} ms, ITL {lv['itl_ms']:g} ms"
            for n, lv in levels.items()
        )
        + "."
    )
    _plot(rows, png)
    md = "\n\n".join(head) + "\n\n" + "\n".join(lines) + f"\n\n![client overhead]({png.name})\n"
    return md, png


def _plot(rows: list[dict[str, Any]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    clients = sorted({r["client"] for r in rows})
    for c in clients:
        pts = sorted((r["streams"], r) for r in rows if r["client"] == c)
        xs = [p[0] for p in pts]
        for ax, key in zip(axes, ("cpu_s_per_1k_tokens", "client_cores", "itl_err_p99_ms"), strict=True):
            ys = [p[1].get(key) for p in pts]
            ok = [(x, y) for x, y in zip(xs, ys, strict=True) if isinstance(y, (int, float)) and y > 0]
            if ok:
                ax.plot([o[0] for o in ok], [o[1] for o in ok], marker="o", label=c)
    for ax, title in zip(
        axes,
        (
            "client CPU s per 1,000 tokens (whole tree, incl. start-up)",
            "client cores during the run",
            "ITL p99 error vs server truth, ms",
        ),
        strict=True,
    ):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrent streams")
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def replace_section(doc: Path, name: str, body: str) -> None:
    """Replace the text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` in ``doc``."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = doc.read_text() if doc.exists() else ""
    block = f"{start}\n{body.strip()}\n{end}"
    if start in text and end in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _m: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text)
