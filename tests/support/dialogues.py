"""Prompt/response end-to-end data: Korean dialogues whose summary is fixed by their topic, and the split and
report parameters for them."""

import json

import numpy as np

RAW = "data/01_raw/dialogues.jsonl"
TOPICS = {"배송": "배송 문의 답변", "가격": "가격 문의 답변", "환불": "환불 문의 답변"}
SPLIT = {
    "prompt_column": "dialogue",
    "response_column": "summary",
    "tokenizer": {"vocab_size": 400},
    "max_length": 48,
    "ratios": {"train": 0.8, "validation": 0.1, "test": 0.1},
}
REPORT = {
    "max_new_tokens": 4,
    "prompts": [""],
    "decoding": [{"name": "greedy"}],
    "eval_max_batches": 2,
    "references": {"max_samples": 12, "max_new_tokens": 8, "batch_size": 4},
}


def write_dialogues(path, n: int = 240):
    """Korean dialogues whose summary is fixed by their topic: a tiny model learns the mapping in seconds."""
    rng = np.random.default_rng(0)
    fillers = [
        "안녕하세요",
        "문의 드립니다",
        "확인 부탁드려요",
        "언제쯤 되나요",
        "감사합니다",
        "네 알겠습니다",
    ]
    rows = []
    for i in range(n):
        topic = list(TOPICS)[i % 3]
        words = [*rng.choice(fillers, size=3), f"{topic} 관련", str(i)]
        rows.append({"dialogue": " ".join(words), "summary": TOPICS[topic]})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
