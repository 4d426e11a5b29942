"""HTTP to an engine's server (loopback, or the scenario's own server): GET, POST of JSON, its model list.

Plain urllib: an engine answering an error status is an answer (status, body), never an exception.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def http_get(url: str, headers: dict[str, str], timeout: float = 5.0) -> tuple[int, bytes]:
    """GET ``url``: its status and body, an error status included."""
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_post_json(url: str, body: dict[str, Any], headers: dict[str, str], timeout: float = 30.0) -> tuple[int, Any]:
    """POST ``body`` as JSON to ``url``: the status and the parsed answer (an error status: the first 300 characters of its body)."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")[:300]


def served_models(url: str, headers: dict[str, str] | None = None, timeout: float = 10.0) -> list[str]:
    """The model ids an OpenAI-compatible server lists at /v1/models (llama-server, vLLM, SGLang, TRT-LLM, TGI all
    answer it); raises OSError when it does not answer with a list."""
    req = urllib.request.Request(url.rstrip("/") + "/v1/models", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = json.loads(resp.read(1 << 20) or b"null")
    except (urllib.error.URLError, ValueError) as exc:
        raise OSError(str(getattr(exc, "reason", exc))) from exc
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise OSError(f"unexpected answer: {str(body)[:120]}")
    return [str(m["id"]) for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
