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


@pytest.mark.parametrize(
    ("raw", "expected", "fix"),
    [
        (
            {"prompt_column": "dialogue"},
            "split.prompt_column is set but split.response_column is not",
            "split.response_column",
        ),
        (
            {"response_column": "summary"},
            "split.response_column is set but split.prompt_column is not",
            "split.prompt_column",
        ),
        (
            {"prompt_column": "q", "response_column": "a", "messages_column": "m"},
            "split.messages_column and split.prompt_column / split.response_column are both set",
            "leave the other unset",
        ),
        (
            {"prompt_template": "Summary:"},
            "split.prompt_template must hold {prompt} exactly once",
            "{prompt}",
        ),
        (
            {"prompt_template": "{prompt} {prompt}"},
            "split.prompt_template must hold {prompt} exactly once",
            "{prompt}",
        ),
    ],
    ids=["prompt_alone", "response_alone", "two_formats", "no_placeholder", "two_placeholders"],
)
def test_a_data_format_mistake_names_its_parameters_not_the_whole_split_group(raw, expected, fix):
    with pytest.raises(ConfigError) as error:
        parse_split_params(raw)
    message = str(error.value)
    assert expected in message and "Fix:" in message and fix in message.split("Fix:")[1]
    assert "\n" not in message and "text_column" not in message and "parameter split =" not in message
