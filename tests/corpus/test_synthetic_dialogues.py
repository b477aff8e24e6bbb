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
    assert counts["rows"] == len(lines) == 50 and sum(json.loads(line)["dialogue"] is None for line in lines) == 1
