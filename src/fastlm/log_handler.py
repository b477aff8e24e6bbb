"""Readable logs: plain lines when output is redirected, and no third-party lines a user did not ask for."""

from __future__ import annotations

import codecs
import logging
import sys

from fastlm.errors import find_user_error

PLAIN_FORMAT = "[%(asctime)s] %(levelname)-7s %(message)s"
# Lines other libraries log at INFO on every run, saying nothing about the user's run.
NOISE = {
    "kedro_mlflow.framework.hooks.mlflow_hook": ("Registering new custom resolver",),
    "kedro.validation.parameter_validator": ("No typed parameter requirements found",),
    # MLflow's SQL store logs each failed statement with its traceback, then raises to the caller: fastlm's
    # tracking (SafeMlflow, the guarded MLflow hook) catches that and warns once; the traceback repeats it.
    "mlflow.store.db.utils": ("SQLAlchemy database error",),
    # kedro-viz's run hook, on every run of part of a pipeline (--from-nodes, --nodes): about its own files
    "kedro_viz.integrations.kedro.run_hooks": ("Workflow tracking is disabled",),
}
NODE_FAILED = "Node %s failed with error"  # kedro.pipeline.node's record of a failing node


# Libraries that log at import what a user cannot act on (torchao: kernels built for other devices it cannot
# load here; torch: a deprecation of torchao's registrations): conf/logging.yml sets these levels for Kedro
# runs, quiet_library_imports for commands without Kedro (merge-adapter).
IMPORT_NOISE_LEVELS = {"torchao": logging.ERROR, "torch.utils._pytree": logging.ERROR}


def quiet_library_imports() -> None:
    """The IMPORT_NOISE_LEVELS on their loggers, for a process that configures no logging of its own."""
    for name, level in IMPORT_NOISE_LEVELS.items():
        logging.getLogger(name).setLevel(level)


def printable_in_any_locale() -> None:
    """Standard output in a locale whose encoding lacks some characters (EUC-KR: an em dash, the byte-level
    tokenizer's 'Ġ'; ASCII: any Korean text) writes those as backslash escapes, as Python's standard error
    does: the log lines go there (Rich's on a terminal, the plain ones when redirected), and a character the
    encoding lacks failed the whole line ("--- Logging error ---" and a traceback instead). A UTF-8 output,
    and one whose error handler is already set (PYTHONIOENCODING=...:replace), are left as they are."""
    stream = sys.stdout
    if stream is None or not hasattr(stream, "reconfigure"):
        return
    if codecs.lookup(stream.encoding or "ascii").name == "utf-8" or stream.errors not in (
        "strict",
        "surrogateescape",
    ):
        return
    stream.reconfigure(errors="backslashreplace")


def plain_logs_when_redirected() -> None:
    """Output not a terminal (CI, nohup, a pipe): the root logger's Rich handlers (conf/logging.yml) become
    one plain line per record, so that a redirected log is not wrapped at Rich's default 80 columns. On a
    terminal nothing changes. (Kedro accepts only its own and the logging module's handler classes in
    logging.yml.)"""
    if sys.stdout.isatty():
        return
    root = logging.getLogger()
    for handler in list(root.handlers):
        if type(handler).__name__ != "RichHandler":
            continue
        plain = logging.StreamHandler(sys.stdout)
        plain.setFormatter(logging.Formatter(PLAIN_FORMAT, datefmt="%m/%d/%y %H:%M:%S"))
        plain.setLevel(handler.level)
        for record_filter in handler.filters:
            plain.addFilter(record_filter)
        root.removeHandler(handler)
        root.addHandler(plain)


class _DropPrefixes(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


class _UserErrorSaidOnce(logging.Filter):
    """Kedro logs a failing node's error in full, then the CLI ends with the same user error as one
    ``fastlm: error:`` line (``fastlm.cli``): for a user error (a ``FastlmError`` in the chain of the
    exception being handled) Kedro's line names the node only."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(NODE_FAILED) and find_user_error(sys.exc_info()[1]) is not None:
            record.msg = "Node %s failed: the fastlm: error line at the end says why and how to fix it."
            record.args = tuple(record.args or ())[:1]
        return True


def quiet_third_party_logs() -> None:
    """Drop the NOISE lines (once per process; a logger keeps its filters), say a user error once, and show
    Python warnings again (conf/logging.yml hides those raised while Kedro loads its plugins)."""
    logging.getLogger("py.warnings").setLevel(logging.WARNING)
    node_logger = logging.getLogger("kedro.pipeline.node")
    if not any(isinstance(f, _UserErrorSaidOnce) for f in node_logger.filters):
        node_logger.addFilter(_UserErrorSaidOnce())
    for name, prefixes in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropPrefixes) for f in logger.filters):
            logger.addFilter(_DropPrefixes(prefixes))


class _RankRecord(logging.LogRecord):
    """A record whose message names the torchrun rank that logged it (``[rank 1] ...``). Only the formatted
    message changes: filters that read ``record.msg`` (the NOISE prefixes, the user error said once) see it as
    logged."""

    rank = 0

    def getMessage(self) -> str:  # noqa: N802 - logging's name
        return f"[rank {self.rank}] {super().getMessage()}"


def other_rank_logs_warnings_only(rank: int) -> None:
    """On a torchrun rank other than 0 (each rank runs the whole ``kedro run``): no INFO or DEBUG record of
    any logger, whatever level conf/logging.yml gives it (``fastlm``, ``kedro`` are at INFO), so the console
    shows rank 0's lines once; warnings and errors are kept, each prefixed with its rank. ``logging.disable``
    and a log-record factory hold for the whole process, whatever handlers a later logging configuration
    sets up. Rank 0 (and a process outside torchrun) is left as it is. Idempotent."""
    if rank <= 0:
        return
    logging.disable(logging.INFO)
    previous = logging.getLogRecordFactory()
    if getattr(previous, "fastlm_rank", None) == rank:
        return

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if type(record) is logging.LogRecord:
            record.__class__ = _RankRecord
            record.rank = rank
        return record

    factory.fastlm_rank = rank
    logging.setLogRecordFactory(factory)
