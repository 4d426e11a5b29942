"""Soak request records at scale: columnar, cached, read in bounded memory.

An 8-hour soak writes about a million request records (each with its per-chunk ITL list) into
``soak/*.jsonl``. Loading them as Python dicts into pandas takes minutes and gigabytes. Here
each JSONL file is compacted once into ``soak/.compact/<file>.parquet`` with the scalar
columns the report uses (no ``itl_s``, no ``text``), by pyarrow's streaming JSON reader, block
by block, so memory stays flat whatever the file's size; the Parquet file is reused while the
JSONL file's size and modification time are unchanged (a soak still running, or resumed,
appends: the cache is rebuilt). A torn last line is left out, as ``read_jsonl`` does; a file
pyarrow cannot parse (a corrupt line in the middle) falls back to ``read_jsonl``, line by line.
Measured on a synthetic 1,000,000-request run: docs/performance.md#report-at-scale.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from harness.records.files import read_jsonl

if TYPE_CHECKING:
    from typing_extensions import Buffer

COMPACT_DIR = ".compact"
BLOCK_BYTES = 8 << 20

# every scalar field of RequestRecord (harness/records/files.py); itl_s, chunk_tokens and text stay in the JSONL only. The
# open-loop fields (scheduled_unix_s, send_delay_s, late) are set in an open-loop soak (soak.arrival), null otherwise
SCHEMA = pa.schema(
    [
        ("config", pa.string()),
        ("phase", pa.string()),
        ("streams", pa.int64()),
        ("repetition", pa.int64()),
        ("stream", pa.int64()),
        ("index", pa.int64()),
        ("prompt_id", pa.string()),
        ("status", pa.string()),
        ("start_unix_s", pa.float64()),
        ("ttft_s", pa.float64()),
        ("e2e_s", pa.float64()),
        ("output_tokens", pa.int64()),
        ("chunks", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("decode_tps", pa.float64()),
        ("e2e_tps", pa.float64()),
        ("itl_token_p50_s", pa.float64()),
        ("itl_token_p99_s", pa.float64()),
        ("draft_tokens", pa.int64()),
        ("accepted_tokens", pa.int64()),
        ("finish_reason", pa.string()),
        ("error_kind", pa.string()),
        ("error", pa.string()),
        ("id", pa.string()),
        ("attempt", pa.string()),
        ("turn", pa.int64()),
        ("scheduled_unix_s", pa.float64()),
        ("send_delay_s", pa.float64()),
        ("late", pa.bool_()),
        ("queued", pa.bool_()),
    ]
)


class _UpToLastNewline(io.RawIOBase):
    """A file read only up to its last complete line (a torn last record is not read)."""

    def __init__(self, path: Path):
        self._f = open(path, "rb")  # noqa: SIM115  closed in close()
        size = os.fstat(self._f.fileno()).st_size
        end = size
        while end > 0:
            step = min(65536, end)
            self._f.seek(end - step)
            block = self._f.read(step)
            nl = block.rfind(b"\n")
            if nl >= 0:
                end = end - step + nl + 1
                break
            end -= step
        self._left = end
        self._f.seek(0)

    def readable(self) -> bool:
        return True

    def readinto(self, b: Buffer, /) -> int:
        view = memoryview(b).cast("B")
        n = min(len(view), self._left)
        if n <= 0:
            return 0
        data = self._f.read(n)
        view[: len(data)] = data
        self._left -= len(data)
        return len(data)

    def close(self) -> None:
        self._f.close()
        super().close()


_LINE_NOT_AN_OBJECT = re.compile(rb"\n[^{]")


def _lines_are_objects(path: Path) -> bool:
    """Whether every line of ``path`` starts with '{', as the records writers write them. Only such a
    file goes to pyarrow's reader: pyarrow 26 takes a ``null`` line for a row of nulls, and kills the
    process (SIGSEGV) when a block starts with one (tests/fuzz/corpus/run_soak)."""
    with open(path, "rb") as f:
        last = b"\n"
        while block := f.read(BLOCK_BYTES):
            if (last == b"\n" and not block.startswith(b"{")) or _LINE_NOT_AN_OBJECT.search(block):
                return False
            last = block[-1:]
    return True


def _compact(src: Path, dst: Path) -> None:
    tmp = dst.with_name(dst.name + ".tmp")
    try:
        if not _lines_are_objects(src):
            raise ValueError(f"{src}: a line that is not a JSON object")  # the forgiving reader below
        with _UpToLastNewline(src) as raw:
            reader = pajson.open_json(
                io.BufferedReader(raw, BLOCK_BYTES),
                read_options=pajson.ReadOptions(block_size=BLOCK_BYTES, use_threads=True),
                parse_options=pajson.ParseOptions(explicit_schema=SCHEMA, unexpected_field_behavior="ignore"),
            )
            with pq.ParquetWriter(tmp, SCHEMA, compression="zstd") as w:
                for batch in reader:
                    w.write_batch(batch)
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError):
        # a corrupt line in the middle: the slow, forgiving reader, still in bounded batches
        with pq.ParquetWriter(tmp, SCHEMA, compression="zstd") as w:
            rows: list[dict[str, object]] = []
            for r in read_jsonl(src):
                rows.append({f.name: _cell(r.get(f.name), f.type) for f in SCHEMA})
                if len(rows) >= 50_000:
                    w.write_table(pa.Table.from_pylist(rows, SCHEMA))
                    rows = []
            if rows:
                w.write_table(pa.Table.from_pylist(rows, SCHEMA))
    os.replace(tmp, dst)


def _cell(value: object, kind: pa.DataType) -> object:
    """A record's value as its column's type; a value of the wrong type is left empty, as a missing one is."""
    if kind == pa.bool_():
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if kind == pa.string():
        return value if isinstance(value, str) else None
    if kind == pa.int64():
        return value if isinstance(value, int) and -(2**63) <= value < 2**63 else None
    return value if isinstance(value, float) or (isinstance(value, int) and abs(value) < 2**63) else None


def compacted(src: Path) -> Path:
    """The Parquet twin of one soak JSONL file, built or rebuilt when the JSONL changed."""
    st = src.stat()
    cdir = src.parent / COMPACT_DIR
    dst = cdir / f"{src.name}.{st.st_size}.{st.st_mtime_ns}.parquet"
    if not dst.exists():
        cdir.mkdir(exist_ok=True)
        for old in cdir.glob(f"{src.name}.*.parquet"):
            old.unlink(missing_ok=True)
        _compact(src, dst)
    return dst


# what the report reads back (harness/report/tables/soak.py soak_table): memory is ~100 bytes a request;
# a table that needs more passes ``columns`` (any of SCHEMA's names)
REPORT_COLUMNS = ["config", "attempt", "status", "error_kind", "start_unix_s", "e2e_s", "ttft_s", "output_tokens", "id"]


def compact_files(files: list[Path]) -> None:
    """Build the Parquet twins now (the soak does it when a slice ends, so the report only reads)."""
    for f in files:
        compacted(f)


def soak_requests_frame(soak_dir: Path, columns: list[str] | None = None) -> pd.DataFrame:
    """All soak request records of a run, without ITL lists or text, in one stable order."""
    files = sorted(soak_dir.glob("*.jsonl")) if soak_dir.is_dir() else []
    tables = [pq.read_table(compacted(f), columns=columns or REPORT_COLUMNS) for f in files]
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return pd.DataFrame()
    # several Locust processes write side by side: one order, whatever the file names (arrow's sort is stable)
    table = pa.concat_tables(tables).sort_by([("start_unix_s", "ascending"), ("id", "ascending")])
    del tables
    df: pd.DataFrame = table.to_pandas(self_destruct=True, split_blocks=True)
    del table
    pa.default_memory_pool().release_unused()
    return df
