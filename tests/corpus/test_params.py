import pytest

from fastlm.corpus.config import parse_split_params
from fastlm.errors import ConfigError


def test_defaults_match_the_documented_ones():
    params = parse_split_params({})
    assert params.max_length == 320 and params.text_column == "text" and params.tokenizer.source == "train"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"ratios": {"train": 0.8, "validation": 0.1, "test": 0.2}}, "must sum to 1"),
        ({"max_length": 1}, "split.max_length = 1 is invalid"),
        ({"max_lenght": 64}, "unknown parameter split.max_lenght (did you mean split.max_length?)"),
        ({"tokenizer": {"vocab_sise": 10}}, "did you mean split.tokenizer.vocab_size?"),
        ({"max_samples": 0}, "split.max_samples = 0 is invalid"),
        ({"num_proc": 0}, "split.num_proc = 0 is invalid"),
        ({"ratios": {"train": -0.1, "validation": 0.6, "test": 0.5}}, "split.ratios.train = -0.1 is invalid"),
        (
            {"prompt_column": "text", "response_column": "text"},
            "split.prompt_column and split.response_column are both 'text'",
        ),
    ],
)
def test_bad_parameters_give_one_line_with_the_fix(raw, expected):
    with pytest.raises(ConfigError) as error:
        parse_split_params(raw)
    message = str(error.value)
    assert expected in message and "Fix:" in message and "\n" not in message
