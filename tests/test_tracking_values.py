"""Parameters and tags reach MLflow as values a person reads (typed, JSON lists, no object reprs)."""

from fastlm.tracking import param_text


class Runner:
    pass


def test_values_are_text_lists_are_json_and_unset_is_not_logged():
    assert param_text(None) is None
    assert param_text(["", "배송"]) == '["", "배송"]'
    assert param_text({"a": 1}) == '{"a": 1}'
    assert param_text(3) == "3" and param_text(True) == "True" and param_text("packed") == "packed"


def test_objects_and_their_reprs_become_class_names():
    assert param_text(Runner()) == "Runner"
    assert (
        param_text("<kedro.runner.sequential_runner.SequentialRunner object at 0x7fe42fe77410>")
        == "SequentialRunner"
    )
