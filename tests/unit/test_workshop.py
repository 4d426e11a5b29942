"""The model workshop: deterministic builds, the keys each speculative type needs, workshop: references.

Whether llama-server loads and speculates with these files: tests/integration/test_workshop_models.py.
"""

from __future__ import annotations

import struct
import textwrap
from pathlib import Path
from typing import Any

import pytest

from engines.llamacpp import LlamaCpp
from harness.common.errors import ScenarioError
from harness.config.loader import load_scenario
from harness.models import NAMES, UnknownModel, WorkshopError, ensure, known_names, recipe, workshop
from harness.models.recipes import RecipeError
from harness.models.ref import ModelNotFound, resolve_model


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every named workshop model, built once into a fresh cache."""
    cache = tmp_path_factory.mktemp("cache-a")
    return {name: ensure(name, cache) for name in NAMES}


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def fields(path: Path) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """The metadata and tensor shapes (ggml order) of a GGUF file, read with the format's own rules.

    Independent of the ``gguf`` package that wrote the file, and fast: GGUFReader spends seconds
    on SmolLM2's 49,152-token vocabulary.
    """
    with open(path, "rb") as fh:
        data = fh.read(8 * 2**20)  # the header; the tensor data follows it
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        pos += n
        return data[pos - n : pos].decode("utf-8")

    def value(vtype: int) -> Any:
        if vtype == 8:
            return string()
        if vtype == 9:
            etype, count = take("<I"), take("<Q")
            return [value(etype) for _ in range(count)]
        return take(_SCALAR[vtype])

    assert data[:4] == b"GGUF"
    pos = 4
    version, n_tensors, n_kv = take("<I"), take("<Q"), take("<Q")
    assert version == 3
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        kv[key] = value(take("<I"))
    shapes: dict[str, tuple[int, ...]] = {}
    for _ in range(n_tensors):
        name = string()
        dims = tuple(take("<Q") for _ in range(take("<I")))
        take("<I"), take("<Q")  # type, offset
        shapes[name] = dims
    kv["n_tokens"] = len(kv["tokenizer.ggml.tokens"])
    kv["mask"] = kv.get("tokenizer.ggml.mask_token_id")
    return kv, shapes


def test_a_rebuild_is_byte_identical_and_the_cache_is_reused(built: dict[str, Path], tmp_path: Path) -> None:
    for name, first in built.items():
        again = ensure(name, tmp_path)
        assert again.name == first.name
        assert again.read_bytes() == first.read_bytes(), f"{name} is not deterministic"
    # a second ensure() finds the file and does not rebuild it
    path = built["smollm2-eagle3"]
    stamp = path.stat().st_mtime_ns
    assert ensure("smollm2-eagle3", path.parent) == path and path.stat().st_mtime_ns == stamp
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_file_names_carry_the_recipe_version(built: dict[str, Path]) -> None:
    for name, path in built.items():
        assert path.name.startswith(f"{name}.r{recipe(name).version}-") and path.suffix == ".gguf"
    assert len({p.name for p in built.values()}) == len(built)


def test_truncated_smollm2_keeps_the_first_blocks_and_everything_else(built: dict[str, Path]) -> None:
    kv, shapes = fields(built["smollm2-trunc4"])
    assert kv["general.architecture"] == "llama" and kv["llama.block_count"] == 4
    assert kv["llama.embedding_length"] == 576 and kv["n_tokens"] == 49152
    assert kv["tokenizer.chat_template"].startswith("{% for message in messages %}")
    blocks = {int(n.split(".")[1]) for n in shapes if n.startswith("blk.")}
    assert blocks == {0, 1, 2, 3}
    assert len(shapes) == 2 + 9 * 4  # token_embd, output_norm, and 9 tensors per block
    assert shapes["token_embd.weight"] == (576, 49152)


def test_eagle3_draft_has_the_keys_and_tensors_llamacpp_asks_for(built: dict[str, Path]) -> None:
    kv, shapes = fields(built["smollm2-eagle3"])
    assert kv["general.architecture"] == "eagle3"
    assert list(kv["eagle3.target_layers"]) == [2, 15, 27]
    assert kv["eagle3.target_hidden_size"] == 576 and kv["eagle3.block_count"] == 1
    n = kv["eagle3.embedding_length"]
    assert shapes["fc.weight"] == (3 * 576, n)
    assert shapes["blk.0.attn_q.weight"][0] == 2 * n  # attention reads [embedding; fused features]
    for t in (
        "attn_norm",
        "attn_norm_2",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_norm",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ):
        assert f"blk.0.{t}.weight" in shapes
    assert {"output_norm.weight", "output.weight", "token_embd.weight"} <= set(shapes)


def test_dflash_draft_has_the_keys_and_tensors_llamacpp_asks_for(built: dict[str, Path]) -> None:
    kv, shapes = fields(built["smollm2-dflash"])
    assert kv["general.architecture"] == "dflash"
    assert list(kv["dflash.target_layers"]) == [2, 15, 27]
    assert kv["dflash.block_size"] == 8 and kv["mask"] == 0
    assert kv["dflash.embedding_length"] == 576  # must equal the target's width
    assert shapes["fc.weight"] == (3 * 576, 576)
    assert {
        "enc.output_norm.weight",
        "output_norm.weight",
        "blk.0.attn_q_norm.weight",
        "blk.0.attn_k_norm.weight",
    } <= set(shapes)


def test_qwen35_target_has_one_recurrent_one_attention_and_one_mtp_block(built: dict[str, Path]) -> None:
    kv, shapes = fields(built["qwen35-tiny-mtp"])
    assert kv["general.architecture"] == "qwen35"
    assert kv["qwen35.block_count"] == 3 and kv["qwen35.nextn_predict_layers"] == 1
    assert kv["qwen35.full_attention_interval"] == 2
    assert "blk.0.ssm_conv1d.weight" in shapes and "blk.0.attn_q.weight" not in shapes  # recurrent
    assert "blk.1.attn_q.weight" in shapes and "blk.1.ssm_a" not in shapes  # full attention
    assert shapes["blk.2.nextn.eh_proj.weight"] == (128, 64)
    for t in ("enorm", "hnorm", "shared_head_norm"):
        assert f"blk.2.nextn.{t}.weight" in shapes
    assert kv["n_tokens"] == 49152  # SmolLM2's tokenizer
    assert len(shapes) == 42


def test_unknown_names_list_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(UnknownModel, match="unknown workshop model 'medusa'; known: smollm2-trunc"):
        ensure("medusa", tmp_path)
    for name in ("smollm2-eagle3", "smollm2-dflash", "qwen35-tiny-mtp"):
        assert name in ", ".join(known_names())
    with pytest.raises(UnknownModel, match=r"N must be within 1\.\.29"):
        ensure("smollm2-trunc30", tmp_path)
    assert not list(tmp_path.iterdir())


def test_workshop_reference_resolves_through_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, built: dict[str, Path]
) -> None:
    monkeypatch.setenv(workshop.CACHE_ENV, str(built["smollm2-eagle3"].parent))
    assert resolve_model("workshop:smollm2-eagle3", tmp_path) == built["smollm2-eagle3"]
    with pytest.raises(ModelNotFound, match=r"unknown workshop model 'nope'; known: .*smollm2-dflash"):
        resolve_model("workshop:nope", tmp_path)


def test_scenario_with_an_unknown_workshop_model_names_line_and_field(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    p = tmp_path / "s.yaml"
    p.write_text(
        textwrap.dedent("""\
        name: t
        server:
          model: m.gguf
        configurations:
          - name: d
            algorithm: draft-simple
            draft: workshop:smollm2-trunc99
            k: 3
        """)
    )
    with pytest.raises(ScenarioError, match=r"s\.yaml:7: configurations\[0\]\.draft: workshop model 'smollm2-trunc99'"):
        load_scenario(p, LlamaCpp.methods)


def test_a_failed_build_leaves_nothing_in_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def half_written(out: Path) -> None:
        out.write_bytes(b"GGUF partial")
        raise RecipeError("boom")

    broken = workshop.Recipe("smollm2-eagle3", 1, "broken", half_written)
    monkeypatch.setitem(workshop._FIXED, "smollm2-eagle3", broken)
    with pytest.raises(WorkshopError, match="workshop model 'smollm2-eagle3': boom"):
        ensure("smollm2-eagle3", tmp_path)
    assert not list(tmp_path.iterdir())


def test_the_hf_folder_recipe_names_a_folder_and_says_what_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = recipe("smollm2-hf")
    assert r.folder and not r.file_name().endswith(".gguf") and "smollm2-hf" not in NAMES
    monkeypatch.setenv("SPECSOAK_VLLM_PYTHON", str(tmp_path / "no-such-venv" / "bin" / "python"))
    with pytest.raises(
        WorkshopError, match=r"smollm2-hf.*vLLM environment's Python, which is not installed .*make vllm"
    ):
        ensure("smollm2-hf", tmp_path / "cache")
    assert not any((tmp_path / "cache").iterdir())  # nothing half-built left behind
