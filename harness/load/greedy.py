"""Greedy answers from one running engine, one request at a time: what ``specsoak verify`` compares across
configurations and what the soak's output canary asks again and again (token ids where the engine returns them)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from engines.base import Engine
from harness.prompts import Prompt


@dataclass(frozen=True)
class Answer:
    prompt_id: str
    text: str = ""
    tokens: tuple[int, ...] | None = None  # None: the engine gave no token ids
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    error: str | None = None


class GreedyClient:
    """Greedy answers from one running engine (llama.cpp: token ids; others: text)."""

    def __init__(self, engine: Engine, url: str | None = None):
        self.engine = engine
        self.url = url or engine.base_url  # the soak's canary asks through the request URL (a proxy in between)
        self.tokens = engine.name == "llamacpp"

    def _post(self, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **self.engine.request_headers()},
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.loads(resp.read())
        if not isinstance(data, dict):
            raise ValueError(f"{path}: answer is not an object")
        return data

    def answer(
        self, prompt: Prompt, max_tokens: int, temperature: float, seed: int, timeout: float, pid: str | None = None
    ) -> Answer:
        pid = pid or prompt.id
        try:
            if self.tokens:
                templ = self._post("/apply-template", {"messages": prompt.messages}, timeout)
                body = {
                    "prompt": templ["prompt"],
                    "n_predict": max_tokens,
                    "temperature": temperature,
                    "seed": seed,
                    "cache_prompt": False,
                    "return_tokens": True,
                    "stream": False,
                }
                r = self._post("/completion", body, timeout)
                t = r.get("timings") or {}
                return Answer(
                    pid,
                    str(r.get("content", "")),
                    tuple(int(x) for x in r.get("tokens") or ()),
                    t.get("draft_n"),
                    t.get("draft_n_accepted"),
                )
            body = {
                "messages": prompt.messages,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "seed": seed,
                "stream": False,
                **self.engine.answer_extras(),
            }
            r = self._post(self.engine.chat_path, body, timeout)
            choice = (r.get("choices") or [{}])[0]
            ids = choice.get("token_ids")  # vLLM, asked with return_token_ids (engines/vllm.py answer_extras)
            tokens = (
                tuple(int(x) for x in ids) if isinstance(ids, list) and all(isinstance(x, int) for x in ids) else None
            )
            return Answer(pid, str((choice.get("message") or {}).get("content") or ""), tokens)
        except (OSError, ValueError, KeyError, urllib.error.HTTPError) as exc:
            return Answer(pid, error=f"{type(exc).__name__}: {exc}")
