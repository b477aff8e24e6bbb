"""The synthetic corpus generator: determinism, the committed demo file, and the profiles' shapes."""

from __future__ import annotations

import json
import re
import statistics
import unicodedata
from collections import Counter
from pathlib import Path

import pytest
from demo_data.texts import PROFILES, make_texts, write_demo_corpus

DEMO_FILE = Path(__file__).resolve().parents[2] / "data/01_raw/demo_corpus.jsonl"
HANGUL = re.compile("[\uac00-\ud7a3]")


@pytest.fixture(scope="module")
def demo_texts() -> list[str]:
    return make_texts(24_000, seed=0, profile="demo")


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("demo") / "demo_corpus.jsonl"
    counts = write_demo_corpus(path)
    return path, counts


@pytest.fixture(scope="module")
def demo_values(demo_file) -> list[object]:
    path, _ = demo_file
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n")[:-1]]
    assert all(list(row) == ["text"] for row in rows)
    return [row["text"] for row in rows]


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_make_texts_is_deterministic(profile):
    first = make_texts(3_000, seed=7, profile=profile)
    assert first == make_texts(3_000, seed=7, profile=profile)
    assert len(first) == 3_000
    other = make_texts(3_000, seed=8, profile=profile)
    assert other != first
    assert sum(a != b for a, b in zip(first, other, strict=True)) > 2_000


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_texts_are_clean_strings(profile):
    texts = make_texts(3_000, seed=1, profile=profile)
    assert all(isinstance(t, str) and t for t in texts)
    assert all(t == t.strip() for t in texts)
    assert all(unicodedata.is_normalized("NFC", t) for t in texts)
    assert not any("  " in t or "{" in t or "}" in t or "\n" in t for t in texts)


def test_edge_arguments():
    assert make_texts(0) == []
    assert make_texts(1, seed=3) == make_texts(1, seed=3)
    with pytest.raises(ValueError, match="profile"):
        make_texts(5, profile="nope")
    with pytest.raises(ValueError):
        make_texts(-1)


def test_prefix_independent_of_other_profiles():
    # Generating another profile first must not change the result (no shared global RNG state).
    expected = make_texts(500, seed=4)
    make_texts(500, seed=4, profile="short")
    assert make_texts(500, seed=4) == expected


def test_demo_file_matches_committed_bytes(demo_file):
    path, _ = demo_file
    assert DEMO_FILE.is_file(), f"{DEMO_FILE} is missing: run python scripts/make_demo_corpus.py"
    assert path.read_bytes() == DEMO_FILE.read_bytes()


def test_demo_file_format(demo_file):
    path, counts = demo_file
    data = path.read_bytes()
    assert b"\r\n" not in data.replace(b"\\r\\n", b"")
    assert data.endswith(b"\n") and not data.endswith(b"\n\n")
    assert data.count(b"\n") == counts["rows"] == 24_000
    assert counts["bytes"] == len(data) < 4_000_000
    first = data.split(b"\n", 1)[0].decode("utf-8")
    assert first.startswith('{"text": ')
    assert "\\u" not in data.decode("utf-8").replace("\\u3000", "")  # ensure_ascii=False


def test_demo_file_dirty_rows(demo_file, demo_values):
    _, counts = demo_file
    values = demo_values
    strings = [v for v in values if isinstance(v, str)]
    assert counts["dirty"] == {
        "empty": 40,
        "whitespace_only": 40,
        "exact_duplicate": 40,
        "whitespace_variant": 10,
        "nfd_variant": 10,
        "non_string": 11,
    }
    assert sum(v == "" for v in strings) == 40
    whitespace = [v for v in strings if v and not v.strip()]
    assert len(whitespace) == 40
    for char in (" ", "\t", "\n", "\u3000"):
        assert any(char in v for v in whitespace), repr(char)
    kinds = Counter(type(v).__name__ for v in values if not isinstance(v, str))
    assert kinds["int"] >= 2 and kinds["float"] >= 2 and kinds["NoneType"] >= 1
    assert kinds["bool"] >= 1 and True in values and kinds["list"] >= 1

    exact = set(strings)
    nfd = [v for v in strings if not unicodedata.is_normalized("NFC", v)]
    assert len(nfd) == 10
    assert all(HANGUL.search(unicodedata.normalize("NFC", v)) for v in nfd)
    assert all(unicodedata.normalize("NFC", v) in exact for v in nfd)
    padded = [v for v in strings if v.strip() and v != v.strip()]
    assert len(padded) == 10
    assert all(v.strip() in exact for v in padded)
    texts = [v for v in strings if v.strip()]
    assert len(texts) - len(set(texts)) >= 40 + counts["natural_duplicates"]


def test_demo_file_cleaning_counts(demo_file, demo_values):
    _, counts = demo_file
    seen: dict[str, int] = {}
    for v in demo_values:
        if isinstance(v, str) and (cleaned := unicodedata.normalize("NFC", v).strip()):
            seen[cleaned] = seen.get(cleaned, 0) + 1
    expected = counts["expected_cleaning"]
    assert expected["kept"] == len(seen) >= 20_000
    assert expected["duplicate"] == sum(seen.values()) - len(seen)
    assert expected["missing"] == sum(v is None for v in demo_values)
    assert expected["empty"] == 40 and expected["whitespace_only"] == 40


def test_demo_korean_share(demo_texts):
    share = sum(bool(HANGUL.search(t)) for t in demo_texts) / len(demo_texts)
    assert 0.25 <= share <= 0.55
    english = sum(not HANGUL.search(t) and re.search("[A-Za-z]", t) is not None for t in demo_texts)
    assert english / len(demo_texts) >= 0.4


def test_demo_length_distribution(demo_texts):
    lengths = sorted(len(t) for t in demo_texts)
    median = statistics.median(lengths)
    assert 30 <= median < 80
    assert statistics.mean(lengths) > median * 1.2  # right-skewed
    long = [n for n in lengths if n > 800]
    assert len(long) / len(lengths) >= 0.002
    assert max(lengths) <= 1_400
    assert lengths[int(0.99 * len(lengths))] > 3 * median


def test_demo_natural_duplicates(demo_texts):
    rate = 1 - len(set(demo_texts)) / len(demo_texts)
    assert 0.005 <= rate <= 0.03
    assert "배송 빨라요" in demo_texts or "Great product!" in demo_texts


def test_demo_vocabulary_is_rich(demo_texts):
    words = Counter(w for t in demo_texts for w in re.findall(r"[A-Za-z]+|[\uac00-\ud7a3]+", t))
    english = sum(1 for w in words if w.isascii())
    korean = len(words) - english
    assert english >= 300 and korean >= 300


def test_short_profile_lengths():
    texts = make_texts(20_000, seed=0, profile="short")
    mean = statistics.fmean(len(t) for t in texts)
    assert 30 <= mean <= 50
    assert max(len(t) for t in texts) < 400
    share = sum(bool(HANGUL.search(t)) for t in texts) / len(texts)
    assert 0.25 <= share <= 0.55


def test_reviews_profile_lengths():
    texts = make_texts(20_000, seed=0, profile="reviews")
    lengths = [len(t) for t in texts]
    assert 20 <= statistics.median(lengths) <= 35
    very_long = sum(500 <= n <= 2_000 for n in lengths) / len(lengths)
    assert 0.005 <= very_long <= 0.02
    assert max(lengths) <= 2_000
    assert any(HANGUL.search(t) for t in texts) and any(t.isascii() for t in texts)
