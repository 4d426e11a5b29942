"""A tiny local Hugging Face tokenizer (word level, ~1,000 words) for peers that insist on one.

Peers count prompt and output tokens with a tokenizer they load by name; on a machine that
cannot reach a model hub, this folder is that tokenizer. Run inside the peers' environment:

    .venv-bench/bin/python bench/tokenizer.py /tmp/specsoak-bench/tokenizer
"""

from __future__ import annotations

import sys
from pathlib import Path


def build(out: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["tok", "the", "a", "of", "and", "to", "in", "is", "story", "number", "write", "short", "about"] + [
        f"w{i}" for i in range(1000)
    ]
    vocab = {"[UNK]": 0, "[PAD]": 1, "<s>": 2, "</s>": 3}
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
