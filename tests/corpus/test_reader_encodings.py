"""Files that are not UTF-8, or only nearly: the refusal names the line a byte is bad on, shows it and gives a
fix that converts what is wrong alone; a Western single-byte file is not read as Korean CP949."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess

import pytest

from fastlm.corpus import readers
from fastlm.corpus.readers import read_text_table
from fastlm.errors import InputDataError

GOOD = [f"줄 {i}: a UTF-8 line with Korean text, 안녕하세요 세계, and “curly quotes”." for i in range(3000)]


def _jsonl(rows) -> bytes:
    return b"".join(json.dumps({"text": row}, ensure_ascii=False).encode() + b"\n" for row in rows)


@pytest.mark.parametrize(
    ("name", "stray", "encoding"),
    [
        ("cp949.jsonl", "한국어 문장", "cp949"),
        ("latin.txt", "café crème", "cp1252"),
        ("cp949.csv.gz", "한국어", "cp949"),
    ],
)
def test_a_mostly_utf8_file_with_one_bad_line_names_that_line_and_converts_it_alone(
    tmp_path, name, stray, encoding
):
    """A stray line in another encoding among thousands of UTF-8 ones: a whole-file ``iconv`` would garble
    every good line, so the refusal names the line (1-based), shows it, and converts that line alone."""
    lines = [json.dumps({"text": row}, ensure_ascii=False) if ".jsonl" in name else row for row in GOOD]
    data = [line.encode() for line in lines]
    bad = f"line with {stray} in it"
    data[1233] = (json.dumps({"text": bad}, ensure_ascii=False) if ".jsonl" in name else bad).encode(encoding)
    body = (b"text\n" if ".csv" in name else b"") + b"\n".join(data) + b"\n"
    path = tmp_path / name
    path.write_bytes(gzip.compress(body) if name.endswith(".gz") else body)
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    line = 1234 + (".csv" in name)
    assert "\n" not in message and message.startswith(f"{path} is not valid UTF-8 at line {line}")
    assert f"{stray}" in message  # the line as read in the encoding it looks like
    assert "\\x" in message  # and its bytes as they are
    assert "its other lines are UTF-8" in message and "fix or remove that line" in message
    assert "iconv -f" not in message  # no whole-file conversion
    assert f"l.decode('{encoding}')" in message  # the one-liner converting the bad lines alone
    one_liner = message.split("python3 -c ")[1].split(" < ")[0]
    if name.endswith(".gz"):
        return
    converted = subprocess.run(
        ["python3", "-c", one_liner.strip('"')], input=path.read_bytes(), capture_output=True, check=True
    ).stdout
    fixed = tmp_path / f"fixed{path.suffix}"
    fixed.write_bytes(converted)
    texts = list(read_text_table(fixed)["text"])
    assert texts[1233] == bad and texts[:1233] == GOOD[:1233] and texts[1234:] == GOOD[1234:]


def test_several_bad_lines_are_counted_and_the_first_ones_named(tmp_path):
    data = [row.encode() for row in GOOD]
    for number in (10, 500, 2999):
        data[number - 1] = f"stray é on line {number}".encode("latin-1")
    path = tmp_path / "three.txt"
    path.write_bytes(b"\n".join(data) + b"\n")
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    assert (
        message.startswith(f"{path} is not valid UTF-8 at line 10") and "2 more lines (500, 2999)" in message
    )


def test_a_whole_file_in_a_western_encoding_names_its_first_bad_line_and_a_known_iconv_name(tmp_path):
    path = tmp_path / "french.csv"
    rows = ["An ASCII line."] * 4 + ["Ça a été très bien, chère amie."] * 200
    path.write_bytes(("text\n" + "\n".join(rows) + "\n").encode("cp1252"))
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    assert message.startswith(f"{path} is not valid UTF-8 at line 6") and "Ça a été" in message
    assert f"iconv -f CP1252 -t UTF-8 {path} > converted.csv" in message or "iconv -f ISO-8859-1" in message
    assert "python3 -c " in message and "decode('" in message  # the fallback where iconv is missing


# all-caps Portuguese: Ç (C7) and Ã (C3) or Õ (D5) make a KS X 1001 Hangul syllable read as CP949
PORTUGUESE_CAPS = "AVISO DE INFORMAÇÃO PARA A POPULAÇÃO: ATENÇÃO ÀS EDIÇÕES"


@pytest.mark.parametrize(
    "rows",
    [[PORTUGUESE_CAPS] * 200, ["INFORMAÇÃO", "informação"] * 20],
    ids=["all_caps", "half_of_its_accents_hangul"],
)
def test_a_western_text_whose_accents_pair_into_hangul_is_not_read_as_korean(tmp_path, rows):
    """A syllable between two Latin letters (INFORMA플O) is a Western word's accents, not Korean: at half
    of the accents such syllables (the old threshold's tie) the file was read as CP949 all the same."""
    path = tmp_path / "avisos.csv"
    path.write_bytes(("text\n" + "\n".join(rows) + "\n").encode("cp1252"))
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    assert message.startswith(f"{path} is not valid UTF-8 at line 2") and "\\xc7\\xc3O" in message
    assert "CP949" not in message and "EUC-KR" not in message and "플" not in message


def test_korean_just_over_half_of_its_non_ascii_characters_is_still_read_as_korean(tmp_path):
    """The other side of the margin: Korean whose Hangul is just over half its non-ASCII characters (the
    rest Hanja, as older news writes) reads as CP949, its syllables beside Latin letters counted too when
    a space or a digit stands on one side (``API를``)."""
    rows = ["大韓民國 憲法", "한국 헌법 API를 읽다", "第一條 國家"] * 20
    path = tmp_path / "hanja.csv"
    path.write_bytes(("text\n" + "\n".join(rows) + "\n").encode("cp949"))
    assert list(read_text_table(path)["text"]) == rows


def test_every_encoding_named_to_iconv_is_one_iconv_knows():
    """``iconv -l`` of this machine (glibc) knows each name a fix may give it."""
    if shutil.which("iconv") is None:
        pytest.skip("no iconv here")
    known = set(
        subprocess.run(["iconv", "-l"], capture_output=True, text=True).stdout.replace(",", " ").split()
    )
    known = {name.rstrip("/").upper() for name in known}
    import encodings.aliases

    for codec in sorted(set(encodings.aliases.aliases.values())):
        name = readers.iconv_name(codec)
        if name is not None:
            assert name in known, (codec, name)


@pytest.mark.parametrize("name", ["rows.csv", "rows.txt", "rows.jsonl", "rows.tsv.gz"])
@pytest.mark.parametrize(("codec", "named"), [("utf-16-le", "UTF-16LE"), ("utf-16-be", "UTF-16BE")])
def test_utf16_without_a_byte_order_mark_is_refused_naming_it(tmp_path, name, codec, named):
    """A file saved as UTF-16 without its byte-order mark (Windows tools, a database export) holding ASCII
    text is valid UTF-8 byte for byte: every character was read followed by a NUL, a CSV's header as the
    column 't\\x00e\\x00x\\x00t\\x00' and a .txt's lines trained as such. Refused in one line naming UTF-16
    and the iconv command; a lone NUL inside a UTF-8 text is no such file."""
    text = (
        "".join(json.dumps({"text": f"review {i}: fast delivery"}) + "\n" for i in range(50))
        if ".jsonl" in name
        else "text\n" + "".join(f"review {i}: fast delivery\n" for i in range(50))
    )
    data = text.encode(codec)
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    assert f"looks like {named} without a byte-order mark" in message and "\n" not in message, message
    assert f"iconv -f {named} -t UTF-8" in message
    nul = tmp_path / "nul.csv"
    nul.write_bytes(b"text\nfirst\x00 text\nsecond text\n")
    assert read_text_table(nul)["text"].tolist() == ["first\x00 text", "second text"]


@pytest.mark.parametrize("name", ["rows.csv", "rows.txt"])
def test_korean_cp949_after_a_utf8_bom_reads_its_header_and_first_line_as_written(tmp_path, name):
    """A UTF-8 byte-order mark before CP949 text (a header saved "UTF-8 with BOM" joined with a CP949 export,
    text appended in CP949 to such a file): the file is read as CP949 with the mark left out. Was: the mark's
    bytes read as CP949 too, with the first letter: the header ``text`` became the column '癤퓍ext' (then
    `has no column 'text'`), a .txt's first line began with '癤'."""
    rows = ["배송이 빨라요", "가격 대비 품질이 훌륭합니다", "포장이 꼼꼼해서 만족해요"] * 20
    text = ("text\n" if name.endswith(".csv") else "") + "\n".join(rows) + "\n"
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("cp949"))
    table = read_text_table(path)
    assert list(table.columns) == ["text"] and list(table["text"]) == rows


@pytest.mark.parametrize("name", ["rows.csv", "rows.txt", "rows.jsonl", "rows.tsv.gz"])
@pytest.mark.parametrize(("codec", "named"), [("utf-32-le", "UTF-32LE"), ("utf-32-be", "UTF-32BE")])
@pytest.mark.parametrize("words", ["fast delivery", "배송이 빨라요"])
def test_utf32_without_a_byte_order_mark_is_refused_naming_it(tmp_path, name, codec, named, words):
    """A file saved as UTF-32 without its byte-order mark holds each character in four bytes, three of them
    NULs for ASCII (two for Korean): valid UTF-8 byte for byte, so it was read as texts of NULs, a CSV's
    header as the column 't\\x00\\x00\\x00e...' and a .txt's lines trained as such. Refused in one line naming
    UTF-32 and the iconv command, as UTF-16 without its mark is."""
    text = (
        "".join(json.dumps({"text": f"review {i}: {words}"}, ensure_ascii=False) + "\n" for i in range(50))
        if ".jsonl" in name
        else "text\n" + "".join(f"review {i}: {words}\n" for i in range(50))
    )
    data = text.encode(codec)
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(InputDataError) as error:
        read_text_table(path, "predict.input")
    message = str(error.value)
    assert f"{path} looks like {named} without a byte-order mark" in message and "\n" not in message, message
    assert f"iconv -f {named} -t UTF-8" in message and "point predict.input at the converted" in message


@pytest.mark.parametrize("codec", ["utf-32", "utf-32-be-bom", "utf-16"])
def test_utf32_or_utf16_with_a_byte_order_mark_is_still_refused_naming_its_encoding(tmp_path, codec):
    """With its byte-order mark a UTF-32 or UTF-16 file is not UTF-8 from its first byte: refused as before,
    naming the encoding the mark says and an iconv command that keeps the text (the mark is no text)."""
    text = "text\n" + "".join(f"review {i}: 배송이 빨라요\n" for i in range(20))
    data = b"\x00\x00\xfe\xff" + text.encode("utf-32-be") if codec == "utf-32-be-bom" else text.encode(codec)
    path = tmp_path / "rows.csv"
    path.write_bytes(data)
    named = "UTF-16" if codec == "utf-16" else "UTF-32"
    with pytest.raises(InputDataError) as error:
        read_text_table(path)
    message = str(error.value)
    assert f"it looks like {named}." in message and "\n" not in message, message
    assert f"iconv -f {named} -t UTF-8 {path} > converted.csv" in message
    assert data.decode(named.lower()) == text  # the command's codec reads the file, its mark left out


def test_utf8_korean_text_is_read_as_written(tmp_path):
    """A UTF-8 file of Korean text (the NUL checks look at its start) is read as it was."""
    rows = ["배송이 빨라요", "가격 대비 품질이 훌륭합니다", "포장이 꼼꼼해서 만족해요"] * 20
    path = tmp_path / "rows.csv"
    path.write_bytes(("text\n" + "\n".join(rows) + "\n").encode())
    assert read_text_table(path)["text"].tolist() == rows
