"""Fingerprint of tokenized data: what tokenizer and which parameters produced it.

Stored beside the tokenized splits; every consumer recomputes it from the tokenizer it is about to use
and its own parameters, and refuses stale data with one line saying how to refresh it.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

from fastlm.errors import StaleDataError

FORMAT_VERSION = 1  # bump when tokenization itself changes (e.g. how EOS or truncation work)
REFRESH = "run `kedro run --pipeline=split` to re-tokenize (it overwrites the stale data)"


def tokenizer_digest(tokenizer) -> str:
    """SHA-256 of what decides the ids: the full tokenizer definition and its special tokens."""
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        digest.update(json.dumps(json.loads(backend.to_str()), sort_keys=True).encode("utf-8"))
    else:  # slow tokenizer: hash its saved vocabulary files
        with tempfile.TemporaryDirectory() as folder:
            tokenizer.save_pretrained(folder)
            for path in sorted(Path(folder).rglob("*")):
                if path.is_file() and path.name != "tokenizer_config.json":
                    digest.update(path.name.encode() + b"\0" + path.read_bytes())
    special = {"eos": tokenizer.eos_token_id, "bos": tokenizer.bos_token_id, "pad": tokenizer.pad_token_id}
    digest.update(json.dumps(special, sort_keys=True).encode("utf-8"))
    return digest.hexdigest()


def tokenization_params(max_length: int) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "max_length": int(max_length),
        "add_special_tokens": True,
        "append_eos": True,
        "truncation_side": "right",
        "padding": False,
    }


def make_fingerprint(tokenizer, max_length: int, *, data_digest: str | None = None) -> dict[str, Any]:
    params = tokenization_params(max_length)
    token_digest = tokenizer_digest(tokenizer)
    combined = hashlib.sha256(json.dumps([token_digest, params], sort_keys=True).encode()).hexdigest()
    return {"fingerprint": combined, "tokenizer_sha256": token_digest, "params": params, "data_sha256": data_digest}


def check_fresh(stored: dict[str, Any] | None, tokenizer, max_length: int, *, where: str) -> None:
    """Raise StaleDataError unless ``stored`` matches ``tokenizer`` and ``max_length``."""
    if not stored or "fingerprint" not in stored:
        raise StaleDataError(f"{where} has no tokenization fingerprint, so it cannot be trusted.", fix=REFRESH + ".")
    current = make_fingerprint(tokenizer, max_length)
    if stored["fingerprint"] == current["fingerprint"]:
        return
    old, new = stored.get("params", {}), current["params"]
    changed = [f"{key} {old.get(key)!r} -> {new[key]!r}" for key in new if old.get(key) != new[key]]
    if stored.get("tokenizer_sha256") != current["tokenizer_sha256"]:
        changed.append("the tokenizer changed")
    raise StaleDataError(f"{where} is stale: {', '.join(changed) or 'its fingerprint differs'}.", fix=REFRESH + ".")


def texts_digest(texts, splits) -> str:
    """SHA-256 of the split texts in order, for provenance (which data produced the tokens)."""
    digest = hashlib.sha256()
    for text, split in zip(texts, splits, strict=True):
        digest.update(f"{split}\0{text}\0".encode())
    return digest.hexdigest()
