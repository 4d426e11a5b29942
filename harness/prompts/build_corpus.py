"""Build ``builtin:conversations`` (harness/prompts/conversations.jsonl.gz), byte for byte, from text
that ships with CPython: the language reference's topics (``pydoc_data/topics.py``, what ``help()``
shows) and the source and docstrings of pure-Python standard-library modules. Both are under the PSF
License Agreement, which allows redistribution with its notice kept (CORPUS-LICENSE.txt beside this file).

No PyPI package was found that ships real conversations under a licence that allows redistribution, so
the conversations are written here: a user turn that quotes real text (a function's source, a passage of
the reference, a docstring, a whole module) and asks something about it, and later user turns
(``followups``) that the soak sends with the conversation so far. The engine writes every answer.

    python -m harness.prompts.build_corpus            # rewrite the file
    python -m harness.prompts.build_corpus --check    # exit 1 if the file differs from a rebuild

The output depends on the Python that builds it (its standard library is the text): the file's first
line names the version, and --check refuses another one. Everything else is fixed: modules and topics in
sorted order, choices drawn from ``random.Random(SEED)``.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import io
import json
import random
import sys
import sysconfig
from pathlib import Path
from typing import Any

SEED = 17
OUT = Path(__file__).with_name("conversations.jsonl.gz")

# pure-Python modules with plenty of readable functions; sorted, fixed: the corpus must not depend on what is installed
MODULES = sorted(
    [
        "argparse",
        "ast",
        "base64",
        "bisect",
        "calendar",
        "cmd",
        "codecs",
        "colorsys",
        "configparser",
        "contextlib",
        "copy",
        "csv",
        "dataclasses",
        "datetime",
        "difflib",
        "dis",
        "email/utils.py",
        "enum",
        "filecmp",
        "fileinput",
        "fnmatch",
        "fractions",
        "ftplib",
        "functools",
        "genericpath",
        "getopt",
        "gettext",
        "glob",
        "gzip",
        "hashlib",
        "heapq",
        "hmac",
        "html/__init__.py",
        "html/parser.py",
        "http/cookies.py",
        "imaplib",
        "inspect",
        "ipaddress",
        "json/decoder.py",
        "json/encoder.py",
        "keyword",
        "linecache",
        "locale",
        "logging/__init__.py",
        "mailbox",
        "mimetypes",
        "ntpath",
        "numbers",
        "operator",
        "optparse",
        "pathlib",
        "pickle",
        "pkgutil",
        "platform",
        "plistlib",
        "posixpath",
        "pprint",
        "queue",
        "quopri",
        "random",
        "re/_parser.py",
        "reprlib",
        "sched",
        "secrets",
        "selectors",
        "shlex",
        "shutil",
        "smtplib",
        "socket",
        "statistics",
        "string",
        "subprocess",
        "tarfile",
        "tempfile",
        "textwrap",
        "threading",
        "timeit",
        "tokenize",
        "traceback",
        "types",
        "typing",
        "urllib/parse.py",
        "uuid",
        "warnings",
        "wave",
        "weakref",
        "zipfile",
        "zipimport",
    ]
)

CODE_ASKS = [
    "Explain what this function from the Python standard library ({name}) does, step by step.",
    "I found this in the standard library ({name}). What is it for, and how does it work?",
    "Walk me through this code ({name}). What are its inputs, outputs and side effects?",
    "Can you explain this function ({name}) to someone who knows Python but has never read the standard library?",
    "What does this function ({name}) return, and in which cases does it raise?",
]
CODE_FOLLOWUPS = [
    "Rewrite it with type hints and a docstring in Google style.",
    "Write pytest tests for it, including the edge cases.",
    "What edge cases could trip it up?",
    "How would you make it faster? Show the code.",
    "Rewrite it without any loop, if that can be done cleanly.",
    "Translate it to idiomatic Rust.",
    "Translate it to JavaScript.",
    "Explain the trickiest line in more detail.",
    "Is there anything in it you would call a bug?",
    "Show a short example of calling it, with its output.",
]
SHORT_ASKS = [
    "In one sentence: what does {name} do in Python?",
    "What is {name} in Python's standard library? Keep it short.",
    "Give me a one-line example that uses {name}.",
    "When would I use {name}? Two sentences at most.",
]
PROSE_ASKS = [
    "Here is a passage from the Python language reference. Summarise it for a beginner.\n\n{text}",
    "Explain this part of the Python documentation in plain words:\n\n{text}",
    "I am reading the Python reference and I do not get this section. What does it say?\n\n{text}",
    "{text}\n\nWhat are the key points of the text above? Use a short list.",
    "Turn this passage of the Python reference into three quiz questions with answers:\n\n{text}",
]
PROSE_FOLLOWUPS = [
    "Give a small code example that shows it.",
    "What is a common mistake people make with this?",
    "How does this differ in Python 2?",
    "Explain it again as if I were ten years old.",
    "Which part of it matters most in everyday code?",
    "Write a short paragraph about it for a blog post.",
    "Can you compare it with how another language does the same thing?",
]
DOC_ASKS = [
    "Here is the documentation of {name}:\n\n{text}\n\nHow would I use it in a small script? Show the script.",
    "Based on this docstring of {name}, write an example of using it:\n\n{text}",
    "Rewrite this documentation of {name} so that it is easier to read:\n\n{text}",
]
LONG_ASKS = [
    "Review this module from the Python standard library ({name}). "
    "What does it do, how is it organised, and what would you improve?\n\n```python\n{text}\n```",
    "Summarise the following source file ({name}) in ten bullet points.\n\n```python\n{text}\n```",
    "List every public function in this code ({name}) with a one-line description of each.\n\n```python\n{text}\n```",
]
LONG_FOLLOWUPS = [
    "Which function in it would you test first, and how?",
    "Pick one function and rewrite it to be clearer.",
    "What would change if this were written today with modern Python?",
]


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def module_path(name: str) -> Path:
    rel = name if name.endswith(".py") else f"{name}.py"
    path = stdlib_dir() / rel
    if not path.is_file():
        raise SystemExit(f"build_corpus: {path} not found (this Python's standard library differs)")
    return path


def functions(name: str) -> list[tuple[str, str, str | None]]:
    """(qualified name, source, docstring) of every function and method of a module, in file order."""
    path = module_path(name)
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    mod = name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    out: list[tuple[str, str, str | None]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                src = ast.get_source_segment(text, child)
                if src:
                    out.append((f"{mod}.{prefix}{child.name}", src, ast.get_docstring(child)))

    visit(tree, "")
    return out


def paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def passages(rng: random.Random, topic_text: str) -> list[str]:
    """Cut a topic into passages of a few hundred to several thousand characters, at paragraph breaks."""
    paras = paragraphs(topic_text)
    out: list[str] = []
    i = 0
    while i < len(paras):
        want = rng.choice([400, 800, 1500, 3000, 6000])
        chunk: list[str] = []
        while i < len(paras) and sum(len(c) for c in chunk) < want:
            chunk.append(paras[i])
            i += 1
        out.append("\n\n".join(chunk))
    return out


def followups(rng: random.Random, pool: list[str], most: int) -> list[str]:
    n = min(most, rng.choice([0, 1, 1, 2, 2, 3]))
    return rng.sample(pool, n)


def build() -> list[dict[str, Any]]:
    from pydoc_data.topics import topics

    rng = random.Random(SEED)
    convs: list[dict[str, Any]] = []
    seen: set[str] = set()

    def add(kind: str, key: str, text: str, follow: list[str]) -> None:
        if text in seen:
            return
        seen.add(text)
        convs.append(
            {
                "id": f"{kind}-{len(convs):04d}-{key}"[:80],
                "kind": kind,
                "messages": [{"role": "user", "content": text}],
                "followups": follow,
            }
        )

    # prose: the language reference, passage by passage
    for topic in sorted(topics):
        for j, passage in enumerate(passages(rng, topics[topic])):
            if len(passage) < 200:
                continue
            add(
                "prose", f"{topic}-{j}", rng.choice(PROSE_ASKS).format(text=passage), followups(rng, PROSE_FOLLOWUPS, 3)
            )

    for mod in MODULES:
        funcs = functions(mod)
        # code: functions of a readable size, explained and then reworked over a few turns
        sized = [f for f in funcs if 120 <= len(f[1]) <= 4000]
        for qual, src, _doc in rng.sample(sized, min(6, len(sized))):
            ask = rng.choice(CODE_ASKS).format(name=qual)
            add("code", qual, f"{ask}\n\n```python\n{src}\n```", followups(rng, CODE_FOLLOWUPS, 3))
        # short: one line, no code quoted
        public = [f for f in funcs if not f[0].rsplit(".", 1)[-1].startswith("_")]
        for qual, _src, _doc in rng.sample(public, min(3, len(public))):
            add("short", qual, rng.choice(SHORT_ASKS).format(name=f"`{qual}`"), followups(rng, PROSE_FOLLOWUPS, 1))
        # docs: a docstring of some substance
        documented = [f for f in funcs if f[2] and len(f[2]) >= 300]
        for qual, _src, doc in rng.sample(documented, min(2, len(documented))):
            add("doc", qual, rng.choice(DOC_ASKS).format(name=f"`{qual}`", text=doc), followups(rng, CODE_FOLLOWUPS, 2))

    # long: one to four thousand tokens of one module, from its start
    for mod in MODULES[::3]:
        text = module_path(mod).read_text(encoding="utf-8")
        size = rng.choice([6000, 9000, 12000, 16000])  # short of 8192-token contexts, with room for the turns
        cut = text[:size].rsplit("\n\n", 1)[0]
        add(
            "long",
            mod.removesuffix(".py").replace("/", "."),
            rng.choice(LONG_ASKS).format(name=mod, text=cut),
            followups(rng, LONG_FOLLOWUPS, 2),
        )

    rng.shuffle(convs)  # kinds interleaved: a phase that takes the first N gets a mix
    return convs


def header() -> dict[str, Any]:
    return {
        "_meta": {
            "built_by": "python -m harness.prompts.build_corpus",
            "python": ".".join(map(str, sys.version_info[:3])),
            "seed": SEED,
        }
    }


def render(convs: list[dict[str, Any]]) -> bytes:
    lines = [json.dumps(header(), ensure_ascii=False)] + [json.dumps(c, ensure_ascii=False) for c in convs]
    raw = ("\n".join(lines) + "\n").encode("utf-8")
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(raw)
    return buf.getvalue()


def built_with(path: Path = OUT) -> str:
    """The Python version that built the committed file (its first line)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return str(json.loads(f.readline())["_meta"]["python"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--check", action="store_true", help="compare a rebuild with the committed file; exit 1 if they differ"
    )
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    data = render(build())
    if args.check:
        here = ".".join(map(str, sys.version_info[:3]))
        if args.out.exists() and built_with(args.out) != here:
            print(
                f"{args.out} was built with Python {built_with(args.out)}; this is {here}: rebuild with that one",
                file=sys.stderr,
            )
            return 2
        same = args.out.exists() and args.out.read_bytes() == data
        print(f"{args.out}: {'matches' if same else 'differs from'} a rebuild")
        return 0 if same else 1
    args.out.write_bytes(data)
    print(f"wrote {args.out} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
