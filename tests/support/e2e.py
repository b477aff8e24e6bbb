"""The small split and train parameters the end-to-end tests share, and an MLflow experiment of their own."""

SPLIT = {"tokenizer": {"vocab_size": 400}, "max_length": 48}
TRAIN = {
    "max_steps": 6,
    "log_every": 2,
    "eval_every": 3,
    "save_every": 3,
    "quiet": True,
    "batching": {"micro_batch_size": 8},
    "model": {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4},
}


def own_experiment(project, name: str) -> None:
    """Point the project copy's MLflow runs at their own experiment (the run comparison reads one
    experiment)."""
    mlflow_yml = project / "conf/base/mlflow.yml"
    text = mlflow_yml.read_text()
    assert "    name: fastlm\n" in text
    mlflow_yml.write_text(text.replace("    name: fastlm\n", f"    name: {name}\n", 1))
