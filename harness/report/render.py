"""One report, two renderings: a list of blocks written as Markdown (report.md) and as a
self-contained HTML page (report.html: plots embedded as base64 PNG, no external asset)."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class Block:
    kind: str  # h1 | h2 | h3 | p | list | table | img
    text: str = ""
    items: tuple[str, ...] = ()
    table: pd.DataFrame | None = None
    image: Path | None = None


def h(level: int, text: str) -> Block:
    return Block(f"h{level}", text)


def p(*lines: str) -> Block:
    return Block("p", " ".join(lines))


def ul(items: list[str]) -> Block:
    return Block("list", items=tuple(items))


def table(df: pd.DataFrame) -> Block:
    return Block("table", table=df)


def img(path: Path, alt: str) -> Block:
    return Block("img", alt, image=path)


def to_markdown(blocks: list[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if b.kind.startswith("h"):
            out += ["#" * int(b.kind[1]) + " " + b.text, ""]
        elif b.kind == "p":
            out += [b.text, ""]
        elif b.kind == "list":
            out += [f"- {i}" for i in b.items] + [""]
        elif b.kind == "table" and b.table is not None:
            out += [b.table.to_markdown(index=False) if not b.table.empty else "(no rows)", ""]
        elif b.kind == "img" and b.image is not None:
            out += [f"![{b.text}]({b.image.name})", ""]
    return "\n".join(out)


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.6em 0 1.2em;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right;vertical-align:top}
th{background:#f0f0f0}
td:first-child,td:nth-child(2),th:first-child{text-align:left}
img{max-width:100%;border:1px solid #ddd;margin:0.5em 0 1em}
code{background:#f4f4f4;padding:0 3px}
h2{border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:1.6em}
"""


def _inline(text: str) -> str:
    """Markdown's **bold** and `code` in a paragraph, everything else escaped."""
    out = []
    for i, part in enumerate(text.split("`")):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
            continue
        bold = part.split("**")
        out.append(
            "".join(f"<strong>{html.escape(s)}</strong>" if j % 2 else html.escape(s) for j, s in enumerate(bold))
        )
    return "".join(out)


def to_html(blocks: list[Block], title: str) -> str:
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
    ]
    for b in blocks:
        if b.kind.startswith("h"):
            out.append(f"<{b.kind}>{_inline(b.text)}</{b.kind}>")
        elif b.kind == "p":
            out.append(f"<p>{_inline(b.text)}</p>")
        elif b.kind == "list":
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>")
        elif b.kind == "table" and b.table is not None:
            out.append(
                b.table.to_html(index=False, escape=True, border=0, na_rep="–")
                if not b.table.empty
                else "<p>(no rows)</p>"
            )
        elif b.kind == "img" and b.image is not None:
            data = base64.b64encode(b.image.read_bytes()).decode("ascii")
            out.append(f'<figure><img alt="{html.escape(b.text)}" src="data:image/png;base64,{data}"></figure>')
    out.append("</body></html>")
    return "\n".join(out) + "\n"
