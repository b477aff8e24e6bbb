"""A node's or the run's error masked before any hook records it: kedro-viz writes the error's text and
traceback into ``.viz/kedro_pipeline_events.json`` from its own hook, kedro-mlflow and Kedro's runner log it.
The project CLI masks what it prints; the exception object itself held the secret a parameter gave it."""

from __future__ import annotations

from kedro.framework.hooks import hook_impl

from fastlm.redaction import redact_exception


class RedactedErrorsHook:
    """Mask secrets in the error (and its cause/context chain) in place, first of every hook."""

    @hook_impl(tryfirst=True)
    def on_node_error(self, error: Exception) -> None:
        redact_exception(error)

    @hook_impl(tryfirst=True)
    def on_pipeline_error(self, error: Exception) -> None:
        redact_exception(error)
