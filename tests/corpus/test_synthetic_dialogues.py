import json

from demo_data.dialogues import make_dialogues, write_demo_dialogues


def test_dialogues_are_deterministic_bilingual_and_summaries_name_the_speakers(tmp_path):
    rows = make_dialogues(300, seed=4)
    assert rows == make_dialogues(300, seed=4) and rows != make_dialogues(300, seed=5)
    korean = [row for row in rows if not row["summary"].isascii()]
    assert 0.3 < len(korean) / len(rows) < 0.5
    for row in rows:
        speaker = row["dialogue"].split(":", 1)[0]
        assert speaker in row["summary"] and "{" not in row["dialogue"] + row["summary"]
    assert not any("(는)" in row["summary"] or "(를)" in row["summary"] for row in korean)
    counts = write_demo_dialogues(tmp_path / "d.jsonl", n=50, seed=1)
    lines = (tmp_path / "d.jsonl").read_text(encoding="utf-8").splitlines()
    assert (
        counts["rows"] == len(lines) == 50
        and sum(json.loads(line)["dialogue"] is None for line in lines) == 1
    )


def test_dialogue_lengths_follow_the_samsum_utterance_bins_and_summaries_grow_with_them():
    """SAMSum (16,369 messenger dialogues) is spread uniformly over 3-6, 7-12, 13-18 and 19-30 utterances: the
    demo dialogues are too, so batching is measured on a real corpus's length spread, not on one narrow
    length."""
    rows = make_dialogues(2000, seed=0)
    utterances = [row["dialogue"].count("\n") + 1 for row in rows]
    bins = [(3, 6), (7, 12), (13, 18), (19, 30)]
    shares = [sum(low <= u <= high for u in utterances) / len(rows) for low, high in bins]
    assert all(0.2 < share < 0.3 for share in shares), shares
    assert abs(sum(shares) - 1) < 1e-9  # every dialogue in a bin
    by_bin = [
        [len(row["summary"]) for row, u in zip(rows, utterances, strict=True) if low <= u <= high]
        for low, high in bins
    ]
    means = [sum(lengths) / len(lengths) for lengths in by_bin]
    assert means == sorted(means) and means[-1] > 1.5 * means[0], means
    assert len({row["dialogue"] for row in rows}) == len(rows)  # no accidental duplicates
