"""Project CLI: Kedro's own ``run``, with user errors reported as one line and a non-zero exit.

Kedro picks up ``cli`` from ``<package>.cli`` and lets its commands override the built-in ones.
``--pipeline=NAME`` (singular, what most users type) is accepted as ``--pipelines=NAME`` without a
deprecation warning.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import importlib.util
import logging
import os
import pkgutil
import re
import signal
import sys
import threading
from pathlib import Path, PurePosixPath

import click
from click.core import ParameterSource
from kedro.config import MissingConfigException
from kedro.framework.cli.project import run as kedro_run

import fastlm.pipelines
from fastlm.engine.train.signals import raised_by_signal, stop_delivered
from fastlm.errors import ConfigError, FastlmError, exception_chain, find_user_error
from fastlm.parameters import RAW_PARAMS, params_items
from fastlm.redaction import redact_exception, redact_text
from fastlm.temporary_files import shown_path
from fastlm.unique_keys import KeyTwice, load_unique_keys


@click.group(name="fastlm")
def cli() -> None:
    """fastlm project commands."""


def _run(**kwargs):
    if kwargs.get("pipeline") and not kwargs.get("pipelines"):
        kwargs["pipelines"] = [name.strip() for name in kwargs["pipeline"].split(",") if name.strip()]
        kwargs["pipeline"] = None
    try:
        in_project_folder()
        check_logging_file()
        check_project_folder(Path.cwd())
        check_params_text(click.get_current_context().meta.get(RAW_PARAMS))
        kwargs["params"] = run_params(_config_file_params(), kwargs.get("params"))
        check_env(kwargs.get("env"), kwargs.get("conf_source"), variable=not kwargs.get("env"))
        check_runner_params(kwargs.get("runner"), kwargs.get("runner_params"))
        unknown = unknown_pipelines_error(kwargs.get("pipelines") or [])
        if (
            unknown is not None
        ):  # before Kedro's session, which warns first that it cannot read its parameters
            raise unknown
        with stop_signals_interrupt():
            return kedro_run.callback(**kwargs)
    except KeyboardInterrupt as stop:  # Ctrl-C or a stop signal outside a training loop (which stops at a
        _stopped(stop)  # step with its own line)
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is a user error
        if (stop := _interrupt_in_chain(exc)) is not None:  # what failed as Ctrl-C unwound it (a file write)
            _stopped(stop)
        user_error = find_user_error(exc) or selection_error(exc, kwargs) or config_file_error(exc)
        if user_error is None:
            redact_exception(exc)  # the traceback printed from it shows no credential
            raise
        logging.shutdown()
        click.secho(f"fastlm: error: {redact_text(str(user_error))}", fg="red", err=True)
        sys.exit(user_error.exit_code)


class StopSignal(KeyboardInterrupt):
    """SIGTERM or SIGHUP outside the training loop (``timeout``, Slurm's cancel, a Kubernetes pod's stop, a
    closed terminal), raised where the run is as Ctrl-C is, so the run ends as a Ctrl-C'd one does: its
    MLflow run KILLED, its outputs' locks released, one line and status 130."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


@contextlib.contextmanager
def stop_signals_interrupt(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)):
    """While the run is on, ``signals`` left at their default action (a run under ``nohup`` keeps ignoring
    SIGHUP; a background job of a non-interactive shell SIGINT) raise :class:`StopSignal` in the main thread
    (SIGINT: Python's KeyboardInterrupt, as its own handler does); the training loop's graceful stop takes
    them over around its steps. Each is noted as raised (``signals.raised_by_signal``): one a finalizer
    swallowed (CPython's "Exception ignored in ...") is raised again before the workers start or the first
    step (``signals.raise_swallowed_stop``), where the run went on to its end; a stop noted is the run's
    alone (forgotten as this context ends). A process forked from this
    one (a worker pool) still dies by SIGTERM and SIGHUP, and gets SIGINT's KeyboardInterrupt, as before.

    At the end the previous handler is put back only where this one is still installed: a handler set during
    the run and left (a torchrun rank that lost its peer ignores SIGTERM until its line is printed,
    ``launch.job.run_torchrun_rank``) is no longer ours to replace; put back, the default let torchrun's
    agent kill that rank silently before its line."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    here = os.getpid()

    def interrupt(signum, frame) -> None:
        if os.getpid() != here and signum == signal.SIGINT:
            signal.default_int_handler(signum, frame)
        if os.getpid() != here:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        name = signal.Signals(signum).name
        raise raised_by_signal(KeyboardInterrupt() if signum == signal.SIGINT else StopSignal(name))

    previous = {}
    for signum in signals:
        if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
            previous[signum] = signal.signal(signum, interrupt)
    stop_delivered()  # a stop noted in an earlier run of this process was that run's
    try:
        yield
    finally:
        stop_delivered()  # this run's: raised on, or swallowed where the run had no more to stop
        for signum, handler in previous.items():
            if signal.getsignal(signum) is interrupt:
                signal.signal(signum, handler)


def _interrupt_in_chain(error: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C (or stop signal) ``error`` was raised while handling, if any: a second Ctrl-C inside a
    checkpoint's ``torch.save`` made its zip writer raise its own error over the KeyboardInterrupt."""
    return next((link for link in exception_chain(error) if isinstance(link, KeyboardInterrupt)), None)


def _stopped(stop: KeyboardInterrupt) -> None:
    stop_delivered()
    logging.shutdown()
    what = stop.signal_name if isinstance(stop, StopSignal) else "Ctrl-C"
    click.secho(
        f"fastlm: stopped by {what} before the run finished; what its nodes wrote so far is kept (a split "
        "stopped part way is refused until it is run again); run the same command again to finish it.",
        fg="red",
        err=True,
    )
    sys.exit(130)


_YAML_COMMENT = re.compile(r"(?:^|\s)#")
_UTF8_LOCALE = "run under a UTF-8 locale: `LC_ALL=C.UTF-8 kedro run ...` (or `PYTHONUTF8=1 kedro run ...`)"


def _locale_encoding(encoding: str | None = None) -> str:
    """The file system's encoding (``encoding``, else Python's: the locale's, UTF-8 in UTF-8 mode), with
    the locale variable that set it."""
    import codecs

    name = codecs.lookup(encoding or sys.getfilesystemencoding()).name.upper().replace("_", "-")
    variable = next((key for key in ("LC_ALL", "LC_CTYPE", "LANG") if os.environ.get(key)), None)
    return f"{name}, {variable}={os.environ[variable]}" if variable and encoding is None else name


def _as_typed(text: str, encoding: str | None = None) -> str:
    """``text`` from the command line or the file system (read in the locale's ``encoding``) as its bytes
    read as UTF-8, what a UTF-8 terminal showed when it was typed; as the locale read it where they are not
    UTF-8."""
    encoding = encoding or sys.getfilesystemencoding()
    raw = bytearray()
    for char in text:
        if "\udc80" <= char <= "\udcff":  # a byte the locale did not decode
            raw.append(ord(char) - 0xDC00)
            continue
        try:
            raw += char.encode(encoding)
        except UnicodeEncodeError:  # the C library's decoding of sys.argv: a lone byte as U+0080..U+00FF
            if ord(char) > 0xFF:
                return text
            raw.append(ord(char))
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return text


def check_project_folder(folder: Path, *, encoding: str | None = None) -> None:
    """A project folder whose name has bytes other than ASCII, in a locale whose encoding is not UTF-8
    (``encoding``: the file system's, Python's by default), is refused: Python names files in the locale's
    encoding, but pyarrow, tokenizers, safetensors and SQLite open a path given as text in UTF-8, so the
    split wrote corpus_splits.parquet and failed to read it back (a traceback), and the other pipelines
    would not find (or write elsewhere) the files under data/. An ASCII folder is the same in every locale."""
    import codecs

    text = str(folder)
    if codecs.lookup(encoding or sys.getfilesystemencoding()).name == "utf-8" or text.isascii():
        return
    raise ConfigError(
        f"the project folder {_as_typed(text, encoding)} has a name that is not ASCII and the locale's "
        f"encoding is {_locale_encoding(encoding)}, not UTF-8: pyarrow, tokenizers and safetensors open "
        "paths as UTF-8, so the run would not find the files it writes under data/.",
        fix=f"{_UTF8_LOCALE}; or move the project to a folder whose path is ASCII.",
    )


def check_params_text(raw: str | None) -> None:
    """Refuses a ``--params`` value that YAML would cut at a comment: Kedro reads each value as YAML, where
    `` #`` (or a leading ``#``) starts a comment, so ``run_name=실험 #3`` ran as ``실험`` and
    ``train.checkpoint_dir=ckpt #2`` wrote into ``ckpt``, silently (``#`` inside a word, ``a#b``, and quoted
    values are kept as typed). A value the locale's encoding cannot read is refused (``_undecodable``)."""
    if raw and _undecodable(raw):
        raise ConfigError(
            f"--params {_as_typed(raw)}: its bytes are not text in the locale's encoding "
            f"({_locale_encoding()}), so Kedro cannot read the values.",
            fix=f"{_UTF8_LOCALE}; or type the value in the locale's encoding.",
        )
    for item in params_items(raw or ""):
        key, _, value = item.partition("=")
        typed = value.strip()
        if typed[:1] in ("'", '"') or not _YAML_COMMENT.search(typed):
            continue
        cut = typed[: _YAML_COMMENT.search(typed).start()].strip() or "null"
        quoted = typed.replace("'", "''")
        raise ConfigError(
            f"--params {key.strip()}={typed}: ' #' starts a YAML comment in a --params value, so Kedro would "
            f"run with {key.strip()}={cut}.",
            fix=f"quote the value: --params \"{key.strip()}='{quoted}'\" (or a name without ' #').",
        )


def _undecodable(text: str) -> bool:
    """Whether ``text`` from the command line holds bytes the locale's encoding did not decode (Python keeps
    them as surrogate escapes, e.g. UTF-8 typed in an EUC-KR or ASCII locale)."""
    return any("\udc80" <= char <= "\udcff" for char in text)


def parse_params(ctx: click.Context, param: click.Parameter, value) -> dict:
    """Kedro's ``--params`` parsing (each ``key=value`` read as YAML by OmegaConf, nested at its dots) of the
    items :func:`params_items` cuts; a mapping (a ``--config`` file's) as it is."""
    if isinstance(value, dict):
        return value
    from omegaconf import OmegaConf

    dot_list = []
    for item in params_items(value or ""):
        key, equals, typed = item.partition("=")
        if not equals:
            ctx.fail(
                f"Invalid format of `{param.name}` option: Item `{item}` must contain a key and a value "
                "separated by `=`."
            )
        if not key.strip():
            ctx.fail(f"Invalid format of `{param.name}` option: Parameter key cannot be an empty string.")
        dot_list.append(f"{key.strip()}={typed}")
    return OmegaConf.to_container(OmegaConf.from_dotlist(dot_list))


def _params_text_kept(option: click.Parameter) -> click.Parameter:
    """Kedro's ``--params`` option, keeping the text as typed in the context (``check_params_text``); a text
    the locale could not decode is not parsed (Kedro's YAML parsing raised UnicodeEncodeError's traceback),
    ``check_params_text`` refuses it."""
    if option.name != "params" or option.callback is None:
        return option
    kept = copy.copy(option)

    def callback(ctx: click.Context, param: click.Parameter, value):
        if isinstance(value, str):
            ctx.meta[RAW_PARAMS] = value
            if _undecodable(value):
                return {}
        return parse_params(ctx, param, value)

    kept.callback = callback
    return kept


def _config_file_params() -> dict | str | None:
    """The ``run.params`` of a ``--config`` file when ``--params`` is on the command line too (None
    otherwise). Kedro puts the file's ``run`` section in click's default map (the ``config`` keyword itself
    does not hold the file's path)."""
    context = click.get_current_context(silent=True)
    if context is None or context.get_parameter_source("params") != ParameterSource.COMMANDLINE:
        return None
    return (context.default_map or {}).get("params")


def run_params(in_file: dict | str | None, params: dict | None) -> dict:
    """The run's parameters: a ``--config`` file's ``run.params`` (``in_file``) with ``--params`` over them,
    key by key.

    Kedro takes a command-line option over the config file's whole (click's default map), so `kedro run
    --config sweep_best_run.yml --params train.max_steps=1000` trained the default setting; and it keeps a
    file's dotted keys (``split.max_length: 64``) as they are, one unknown parameter each. Both are nested
    and merged here, as `--params` nests its own."""
    given = _nested(params or {})
    if not in_file:
        return given
    if isinstance(in_file, str):
        context = click.get_current_context()
        option = next(param for param in context.command.params if param.name == "params")
        in_file = parse_params(context, option, in_file)
    return _merged(_nested(in_file), given)


def _nested(params: dict) -> dict:
    """``{"train.optimizer.lr": 0.003}`` as ``{"train": {"optimizer": {"lr": 0.003}}}``, at every level."""
    nested: dict = {}
    for key, value in params.items():
        *parents, last = str(key).split(".")
        level = nested
        for depth, parent in enumerate(parents):
            level = level.setdefault(parent, {})
            if not isinstance(level, dict):
                group = ".".join(parents[: depth + 1])
                raise ConfigError(
                    f"--config/--params: {group} is given a value ({level}) and parameters under it ({key}).",
                    fix=f"keep one of them: {group} is a group of parameters or a value, not both.",
                )
        value = _nested(value) if isinstance(value, dict) else value
        if isinstance(level.get(last), dict) and not isinstance(value, dict):
            raise ConfigError(
                f"--config/--params: {key} is given a value ({value}) and parameters under it "
                f"({', '.join(sorted(level[last]))}).",
                fix=f"keep one of them: {key} is a group of parameters or a value, not both.",
            )
        both = isinstance(level.get(last), dict) and isinstance(value, dict)
        level[last] = _merged(level[last], value) if both else value
    return nested


def _merged(base: dict, over: dict) -> dict:
    merged = dict(base)
    for key, value in over.items():
        both = isinstance(merged.get(key), dict) and isinstance(value, dict)
        merged[key] = _merged(merged[key], value) if both else value
    return merged


def in_project_folder() -> None:
    """A run started in a subfolder of the project runs in the project folder: Kedro finds the project above
    the working folder and makes the catalog's paths the project's, but ``train.checkpoint_dir``, the MLflow
    store (``sqlite:///mlflow.db``) and the other paths in parameters are read from the working folder
    (a second store, checkpoints that a later run from the project folder never resumes). Said once."""
    from kedro.utils import find_kedro_project

    here = Path.cwd()
    project = find_kedro_project(here)
    if project is not None and Path(project).resolve() != here.resolve():
        click.secho(
            f"fastlm: running in the project folder {project} (started in {here.relative_to(project)}): "
            "the paths in conf/ and --params are the project's",
            err=True,
        )
        os.chdir(project)
        project_logging()


def project_logging() -> None:
    """The project's conf/logging.yml applied, as Kedro applies it at start-up in the project folder (it
    looks for the file in the working folder only: from a subfolder its own defaults ran, every dataset load
    and save an INFO line, the project's levels lost), then the adjustments fastlm.settings makes to it. A
    ``KEDRO_LOGGING_CONFIG`` the user set is left as Kedro applied it."""
    from kedro.framework.project import LOGGING
    from kedro.utils import find_config_file

    from fastlm import log_handler
    from fastlm.rank_hooks import torchrun_rank

    path = find_config_file("conf/logging")
    if os.environ.get("KEDRO_LOGGING_CONFIG") or path is None:
        return
    LOGGING.configure(logging_settings(path))
    log_handler.other_rank_logs_warnings_only(torchrun_rank())
    log_handler.quiet_third_party_logs()
    log_handler.plain_logs_when_redirected()


def check_logging_file() -> None:
    """The project's conf/logging.yml (where no ``KEDRO_LOGGING_CONFIG`` replaces it) must not write a key
    twice in one mapping: Kedro applies it at start-up with PyYAML's safe loader, which keeps the last value
    and loses the first (a logger's level written twice, the first never applied), where Kedro's config
    loader refuses the same in the other conf files."""
    from kedro.utils import find_config_file

    path = find_config_file("conf/logging")
    if not os.environ.get("KEDRO_LOGGING_CONFIG") and path is not None:
        logging_settings(path)


def logging_settings(path: Path) -> dict:
    """The logging settings of the file at ``path``, read as ``yaml.safe_load`` reads them, or one ConfigError
    line naming the file, the line and the key a mapping there writes twice."""
    try:
        return load_unique_keys(Path(path).read_text(encoding="utf-8"))
    except KeyTwice as twice:
        file = shown_path(Path(path))
        raise ConfigError(
            f"{file} line {twice.line} has the key {twice.key!r} twice in one mapping; only the last value "
            "would be applied.",
            fix=f"keep one of the two {twice.key} keys in {file} (merge their values into it).",
        ) from None


def check_env(env: str | None, conf_source: str | None, *, variable: bool = False) -> None:
    """``--env NAME`` (or, with ``variable``, the ``KEDRO_ENV`` variable Kedro reads when ``--env`` is not
    given) must name a folder of conf/ (a typo otherwise runs with an empty environment and fails later, e.g.
    as an MLflow file-store traceback, or as Kedro's MissingConfigException traceback)."""
    if variable:
        env = os.environ.get("KEDRO_ENV") or None
    if conf_source and Path(conf_source).is_file() and _archive_protocol(conf_source) is not None:
        _check_conf_archive(conf_source, env, variable=variable)
        return
    conf = Path(conf_source) if conf_source else Path.cwd() / "conf"
    if not env or not conf.is_dir() or (conf / env).is_dir():
        return
    raise _no_env_folder(env, conf, f"KEDRO_ENV={env}" if variable else f"--env {env}")


def _archive_protocol(conf_source: str) -> str | None:
    """``tar`` or ``zip`` where Kedro reads ``--conf-source`` as a packed conf (by its name, as Kedro
    does)."""
    import mimetypes

    kind, _ = mimetypes.guess_type(conf_source)
    if kind == "application/x-tar":
        return "tar"
    return (
        "zip"
        if kind in ("application/zip", "application/x-zip-compressed", "application/zip-compressed")
        else None
    )


def _check_conf_archive(conf_source: str, env: str | None, *, variable: bool) -> None:
    """A packed conf is read by Kedro from the last entry at its top, as the conf folder (``kedro package``
    packs the folder conf/ itself): that folder must hold base/ and the run's environment (``--env``,
    ``KEDRO_ENV``, else ``local``, which ``kedro package`` keeps, empty). Each is one line naming the archive
    (Kedro's own errors named a folder inside it, e.g. ``quick/base``, or the project's folders were offered
    as environments)."""
    import fsspec
    from kedro.framework.project import settings

    conf = settings.CONF_SOURCE
    pack = f"from the project folder: `tar -czf conf.tar.gz {conf}` (or `zip -r conf.zip {conf}`)"
    try:
        files = fsspec.filesystem(_archive_protocol(conf_source), fo=conf_source)
        top = [str(name).strip("/") for name in files.ls("", detail=False)]
    except Exception as exc:  # noqa: BLE001 - not an archive Kedro can read
        raise ConfigError(
            f"--conf-source {conf_source}: not a readable archive ({type(exc).__name__}: {exc}).",
            fix=f"pack the conf folder again, {pack}, or give the conf folder itself.",
        ) from exc
    root = top[-1] if top else ""
    held = files.ls(root, detail=False) if root and files.isdir(root) else []
    folders = sorted(PurePosixPath(str(name).rstrip("/")).name for name in held if files.isdir(str(name)))

    def has(name: str) -> bool:  # the path Kedro opens (``OmegaConfigLoader._get_conf_env_path``)
        return bool(root) and files.isdir(str(PurePosixPath(root) / name))

    base = settings.CONFIG_LOADER_ARGS.get("base_env", "base")
    if not has(base):
        inside = f"holds {', '.join(folders)}" if folders else "holds no folder"
        entries = ", ".join(top) or "no entries"
        raise ConfigError(
            f"--conf-source {conf_source}: Kedro reads the last entry at the top of a packed conf as the "
            f"conf folder and opens {root or '(nothing)'}/{base} in it, which is not there (of {entries}; "
            f"{root or 'it'} {inside}): an archive of the conf folder's contents (`tar -C conf .`) is none.",
            fix=f"pack the conf folder itself, {pack}.",
        )
    run_env = env or settings.CONFIG_LOADER_ARGS.get("default_run_env", "local")
    if has(run_env):
        return
    known = ", ".join(name for name in folders if name != base) or "(none)"
    if env:
        given = f"KEDRO_ENV={env}" if variable else f"--env {env}"
        fix = f"use one of: {known}, or pack {root}/{env} into it."
    else:
        given = f"the default environment {run_env}"
        fix = f"pack {root}/{run_env} into it, empty if need be (`kedro package` keeps it), or give --env "
        fix += f"with one of: {known}."
    raise ConfigError(
        f"{given}: --conf-source {conf_source} holds no {root}/{run_env} folder (it holds "
        f"{', '.join(folders)}).",
        fix=fix,
    )


def _no_env_folder(env: str, conf: Path, given: str) -> ConfigError:
    known = sorted(path.name for path in conf.iterdir() if path.is_dir() and path.name != "base")
    close = difflib.get_close_matches(env, known, n=1)
    names, folder = ", ".join(known) or "(none)", shown_path(conf / env)
    variable = given.startswith("KEDRO_ENV")
    use = f"set KEDRO_ENV to one of: {names}, or unset it" if variable else f"use one of: {names}"
    hint = f" (did you mean {close[0]}?)" if close else ""
    return ConfigError(f"{given}: there is no {folder} folder{hint}.", fix=f"{use}, or create {folder}.")


_RUNNER_PARAMS = {
    "max_workers": "max_workers=<a whole number, 1 or more>",
    "is_async": "is_async=true|false",
}


def check_runner_params(runner: str | None, given: dict | None) -> None:
    """``--runner-params`` must name parameters the runner takes (``is_async``; ``max_workers`` too for
    ThreadRunner and ParallelRunner) with values it can use: Kedro passes them to the runner as they are,
    which raised a traceback for an unknown name or ``max_workers=0`` and took ``is_async=maybe`` as true. An
    unknown ``--runner`` is left to Kedro (``selection_error`` says it in one line)."""
    if not given:
        return
    import inspect

    from kedro.utils import load_obj

    try:
        runner_class = load_obj(runner or "SequentialRunner", "kedro.runner")
        accepted = [name for name in inspect.signature(runner_class.__init__).parameters if name != "self"]
    except (AttributeError, ImportError, TypeError, ValueError):
        return
    name = runner_class.__name__
    takes = ", ".join(_RUNNER_PARAMS.get(param, param) for param in accepted)
    fix = f"--runner-params takes {takes} for {name}"
    unknown = [str(key) for key in given if key not in accepted]
    if unknown:
        workers = (
            " (max_workers is for --runner ThreadRunner or ParallelRunner)"
            if "max_workers" in unknown
            else ""
        )
        raise ConfigError(
            f"--runner-params {', '.join(unknown)}: {name} takes no parameter of that name{workers}.",
            fix=f"{fix}; or drop --runner-params.",
        )
    workers = given.get("max_workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(
            f"--runner-params max_workers={workers}: {name} needs a whole number of workers, 1 or more.",
            fix=f"{fix}; or leave max_workers out (the runner's default).",
        )
    if "is_async" in given and not isinstance(given["is_async"], bool):
        raise ConfigError(
            f"--runner-params is_async={given['is_async']}: is_async is true or false.",
            fix=f"{fix}.",
        )


def config_file_error(exc: Exception) -> FastlmError | None:
    """Kedro's errors about the conf/ files, as one line: a YAML syntax error (Kedro's ParserError, caused by
    PyYAML's) with the file and line; a configuration folder that does not exist (MissingConfigException); one
    key set by two files of one environment (``ValueError: Duplicate keys found in A and B: key``); a file
    that is not UTF-8 (``_not_utf8_conf_error``)."""
    for current in exception_chain(exc):
        if isinstance(current, UnicodeDecodeError):
            not_utf8 = _not_utf8_conf_error(current)
            if not_utf8 is not None:
                return not_utf8
        if isinstance(current, MissingConfigException):
            return _missing_config_error(current)
        duplicates = _DUPLICATES.findall(str(current)) if isinstance(current, ValueError) else []
        if duplicates:
            first, second, keys = duplicates[0]
            more = f" ({len(duplicates) - 1} more pair(s) of files repeat keys)" if duplicates[1:] else ""
            return ConfigError(
                f"{shown_path(second)} and {shown_path(first)} both set {keys}{more}: the files of one conf "
                "environment must not repeat a key (only another environment, e.g. conf/local over "
                "conf/base, may override it).",
                fix=f"keep {keys} in one of the two files and remove it from the other.",
            )
        resolver = _UNKNOWN_RESOLVER.search(str(current))
        if resolver is not None and type(current).__module__.startswith("omegaconf"):
            return _unknown_resolver_error(resolver.group(1), resolver.group(2))
        dataset = _NOT_MADE.search(str(current)) if type(current).__name__ == "DatasetError" else None
        if dataset is not None:
            return _dataset_not_made_error(dataset.group(2), dataset.group(3), dataset.group(1))
        unset = _UNSET_VARIABLE.search(str(current))
        if unset is not None and type(current).__module__.startswith("omegaconf"):
            return _unset_variable_error(unset.group(1), unset.group(2))
        mark = getattr(current, "problem_mark", None)
        if mark is not None and type(current).__module__.startswith("yaml"):
            named = _YAML_FILE.search(str(exc))
            reading = None if named else _conf_file_read(current)
            file = shown_path(named.group(1)) if named else reading or getattr(mark, "name", "a conf/ file")
            problem = getattr(current, "problem", None) or type(current).__name__
            twice = _KEY_TWICE.fullmatch(problem)
            if twice is not None:  # OmegaConf's loader refuses it; Kedro names no file for it (``<file>``)
                key = twice.group(1)
                return ConfigError(
                    f"{file} line {mark.line + 1} has the key {key!r} twice in one mapping; Kedro's config "
                    "loader reads no file that does.",
                    fix=f"keep one of the two {key} keys in {file} (merge their values into it).",
                )
            fix = "correct the YAML there (indentation, a missing ':', or an unclosed bracket or quote)"
            if Path(str(file)).name == TUNED_FILE_NAME:  # the tune's (replaced whole): cut short or edited
                fix = (
                    f"delete {file} and run `kedro run --pipeline=tune` again (it writes that file), or {fix}"
                )
            return ConfigError(
                f"{file} line {mark.line + 1}, column {mark.column + 1}: invalid YAML ({problem}).",
                fix=f"{fix}.",
            )
    return None


TUNED_FILE_NAME = "parameters_tuned.yml"  # what `kedro run --pipeline=tune` writes (conf/base/catalog.yml)


def _conf_file_read(error: BaseException) -> str | None:
    """The conf/ file Kedro's config loader was reading when ``error`` was raised (its frame's
    ``config_filepath``), shown as ``shown_path`` shows it; None where no loader frame names one."""
    loader = _config_loader_frame(error)
    reading = loader.f_locals.get("config_filepath") if loader is not None else None
    return shown_path(Path(reading)) if reading is not None else None


def _config_loader_frame(error: BaseException):
    """The innermost frame of Kedro's config loader (a ``kedro.config`` module) in ``error``'s traceback;
    None where the error was raised outside it."""
    loader = None
    trace = error.__traceback__
    while trace is not None:
        if str(trace.tb_frame.f_globals.get("__name__")).startswith("kedro.config"):
            loader = trace.tb_frame
        trace = trace.tb_next
    return loader


def _not_utf8_conf_error(error: UnicodeDecodeError) -> ConfigError | None:
    """A conf/ file Kedro's config loader could not read as UTF-8 (it reads every file as UTF-8, whatever
    the locale, and its UnicodeDecodeError names no file), as one line naming it: the file the loader was
    reading (its frame's ``config_filepath``), else the files under conf/ that are not UTF-8. None for an
    error raised elsewhere (a node reading a data file)."""
    loader = _config_loader_frame(error)
    if loader is None:
        return None
    reading = loader.f_locals.get("config_filepath")
    if reading is not None:
        files = [shown_path(Path(reading))]
    else:
        from kedro.framework.project import settings

        conf = Path.cwd() / settings.CONF_SOURCE
        files = sorted(
            shown_path(path)
            for path in (conf.rglob("*") if conf.is_dir() else [])
            if path.suffix in (".yml", ".yaml", ".json") and path.is_file() and not _utf8(path)
        )
    named = ", ".join(files) or "a conf/ file"
    first = files[0] if files else "FILE"
    return ConfigError(
        f"{named}: not UTF-8 ({error.reason} at byte {error.start}); Kedro reads the conf/ files as UTF-8 in "
        "every locale.",
        fix=f"save it as UTF-8, e.g. `iconv -f euc-kr -t utf-8 {first} > {first}.utf8 && mv {first}.utf8 "
        f"{first}` (for a file saved in EUC-KR).",
    )


def _utf8(path: Path) -> bool:
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


_UNKNOWN_RESOLVER = re.compile(r"Unsupported interpolation type (\S+)(?:\s+full_key: (\S+))?")
# omegaconf's own resolvers and Kedro's (``oc.env`` is Kedro's in credentials only)
_RESOLVERS = (
    "globals",
    "runtime_params",
    "oc.select",
    "oc.decode",
    "oc.create",
    "oc.dict.keys",
    "oc.dict.values",
)


def _unknown_resolver_error(name: str, key: str | None) -> ConfigError:
    """``${name:...}`` that the config loader does not know, as one line: the files under conf/ that write it
    and the parameter, and ``${env_or:...}`` (the project's) for Kedro's ``oc.env``."""
    from kedro.framework.project import settings

    conf = Path.cwd() / settings.CONF_SOURCE
    files = sorted(
        shown_path(path)
        for path in (conf.rglob("*.y*ml") if conf.is_dir() else [])
        if "${" + name + ":" in path.read_text(encoding="utf-8", errors="replace")
    )
    where = f"{', '.join(files)}: " if files else ""
    at = f" (in {key})" if key else ""
    if name == "oc.env":
        texts = "\n".join((Path.cwd() / path).read_text(encoding="utf-8", errors="replace") for path in files)
        found = re.search(r"\$\{oc\.env:\s*([^,}\s]+)", texts)
        variable = found.group(1) if found else "NAME"
        return ConfigError(
            f"{where}${{oc.env:...}}{at}: Kedro reads environment variables with oc.env in credentials files "
            "only, not in parameters or the catalog.",
            fix=f"write ${{env_or:{variable},<default>}} there (the project's resolver: the variable where "
            "it is set, else the default), or give the value with --params.",
        )
    known = sorted({*_RESOLVERS, *settings.CONFIG_LOADER_ARGS.get("custom_resolvers", {})})
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return ConfigError(
        f"{where}${{{name}:...}}{at}: no resolver {name}{hint}.",
        fix=f"use one of: {', '.join(known)}.",
    )


_NOT_MADE = re.compile(r"^\s*(.*?)\.?\s*Failed to instantiate dataset '([^']+)' of type '([^']+)'", re.DOTALL)


def _dataset_not_made_error(name: str, kind: str, reason: str) -> ConfigError:
    """Kedro's DatasetError for a catalog entry it could not make (a file system whose package is missing,
    such as an ``s3://`` path without s3fs; a bad argument), as one line naming the entry and its files."""
    from kedro.framework.project import settings

    conf = Path.cwd() / settings.CONF_SOURCE
    entry = re.compile(rf"^[\"']?{re.escape(name)}[\"']?\s*:", re.MULTILINE)
    files = sorted(
        shown_path(path)
        for path in (conf.rglob("catalog*.y*ml") if conf.is_dir() else [])
        if entry.search(_conf_text(path))
    )
    where = f" ({', '.join(files)})" if files else ""
    reason = redact_text(" ".join(reason.split())) or "no reason given"
    return ConfigError(
        f"catalog entry {name}{where} of type {kind} could not be made: {reason}.",
        fix="install the package the reason names, or correct the entry's type, filepath or arguments.",
    )


_UNSET_VARIABLE = re.compile(r"Environment variable '([^']+)' not found\"?(?:\s+full_key: (\S+))?")


def _unset_variable_error(variable: str, key: str | None) -> ConfigError:
    """``${oc.env:NAME}`` (Kedro's in credentials files) with NAME not set, as one line naming the files that
    read it, the key and the fix (omegaconf's error holds no value, and none is shown)."""
    from kedro.framework.project import settings

    conf = Path.cwd() / settings.CONF_SOURCE
    files = sorted(
        shown_path(path)
        for path in (conf.rglob("*.y*ml") if conf.is_dir() else [])
        if re.search(r"\$\{oc\.env:\s*" + re.escape(variable) + r"\s*[,}]", _conf_text(path))
    )
    where = f"{', '.join(files)}: " if files else ""
    at = f"{key} reads " if key else "reads "
    return ConfigError(
        f"{where}{at}the environment variable {variable} (${{oc.env:{variable}}}), which is not set.",
        fix=f"set it before the run (`export {variable}=...`), give it a default (${{oc.env:{variable},"
        "<default>}), or remove the entry if no dataset uses it.",
    )


def _conf_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


_YAML_FILE = re.compile(r"Invalid YAML or JSON file (.+?), unable to read")
_DUPLICATES = re.compile(r"Duplicate keys found in (.+?) and (.+?): (.+)")
_KEY_TWICE = re.compile(r"found duplicate key (.+)")
_MISSING_FOLDER = re.compile(r"not a valid directory: (.+)$")


def _missing_config_error(error: Exception) -> ConfigError:
    """Kedro's MissingConfigException: the environment folder named, with the folders there are."""
    message = " ".join(str(error).split())
    folder = _MISSING_FOLDER.search(message)
    if folder is not None and Path(folder.group(1)).parent.is_dir():
        path = Path(folder.group(1))
        variable = os.environ.get("KEDRO_ENV") == path.name
        return _no_env_folder(
            path.name, path.parent, f"KEDRO_ENV={path.name}" if variable else f"environment {path.name}"
        )
    return ConfigError(
        f"Kedro found no configuration: {_shown_conf(message)}.",
        fix="check --env, KEDRO_ENV and --conf-source, and that conf/base holds the project's files.",
    )


def _shown_conf(text: str) -> str:
    """``text`` with the absolute paths under the working directory shown relative to it."""
    return text.replace(f"{Path.cwd().as_posix()}/", "")


def selection_error(exc: Exception, options: dict) -> FastlmError | None:
    """Kedro's errors about what ``kedro run`` selects (``options``: its keyword arguments), as one line: an
    unknown or empty pipeline, a ``--tags`` tag no node has, a node (``--nodes``, ``--from-nodes``,
    ``--to-nodes``), dataset (``--from-inputs``, ``--to-outputs``) or namespace that the pipeline does not
    hold, a ``--load-versions`` dataset the catalog does not hold, an unknown ``--runner``; each with the
    close match and the names there are. None for any other error."""
    names = options.get("pipelines") or []
    message = str(exc)
    if message.startswith("'load_versions' keys") and options.get("load_versions"):
        return _load_versions_error(options)
    if isinstance(exc, ValueError) and "Pipeline contains no nodes" in message and options.get("tags"):
        tags = _selected_names(names, _node_tags)
        tag_error = _unknown_option_names(options, {"--tags": "tags"}, tags, "tag")
        if tag_error is not None:
            return tag_error
    pipeline_error = _pipeline_selection_error(exc, names)
    if pipeline_error is not None or not isinstance(exc, ValueError | AttributeError):
        return pipeline_error
    if isinstance(exc, AttributeError):
        runner = options.get("runner")
        name = str(runner).removeprefix("kedro.runner.")  # a full path reads from kedro.runner too
        if runner and f"module 'kedro.runner' has no attribute '{name}'" in message:
            known = ["SequentialRunner", "ThreadRunner", "ParallelRunner"]
            return _unknown_name("--runner", [runner], known, "runner", where="kedro.runner", matched=name)
        return None
    if message.startswith("Pipeline does not contain nodes named"):
        known = _selected_names(names, lambda pipeline: [node.name for node in pipeline.nodes])
        given = {"--nodes": "node_names", "--from-nodes": "from_nodes", "--to-nodes": "to_nodes"}
        return _unknown_option_names(options, given, known, "node")
    if message.startswith("Pipeline does not contain datasets named"):
        known = _selected_names(names, lambda pipeline: sorted(pipeline.datasets()))
        inputs_error = _unknown_option_names(options, {"--from-inputs": "from_inputs"}, known, "dataset")
        # --to-outputs: what a node outputs (not params:*, nor an input no node writes)
        outputs = _selected_names(names, lambda pipeline: sorted(pipeline.all_outputs()))
        return inputs_error or _unknown_option_names(
            options, {"--to-outputs": "to_outputs"}, outputs, "dataset output"
        )
    if message.startswith("Pipeline does not contain nodes with the following namespaces"):
        tags = _selected_names(names, _node_tags)
        given = [str(name) for name in options.get("namespaces") or []]
        shown, tagged = ", ".join(given), [name for name in given if name in tags]
        hint = f" (did you mean --tags {','.join(tagged)}?)" if tagged else ""
        return ConfigError(
            f"--namespaces {shown}: fastlm's pipelines have no namespaces{hint}.",
            fix=f"select nodes with --tags (one of: {', '.join(tags)}) or --nodes, or drop --namespaces.",
        )
    return None


def _load_versions_error(options: dict) -> FastlmError | None:
    """Kedro's DatasetNotFoundError for a ``--load-versions`` name the catalog does not hold, as one line with
    the close match and the versioned datasets (the run's catalog.yml, read again here)."""
    from kedro.framework.project import settings

    from fastlm.hooks import load_versions_error

    conf_source = options.get("conf_source") or str(Path.cwd() / settings.CONF_SOURCE)
    env = options.get("env") or os.environ.get("KEDRO_ENV") or None
    try:
        loader = settings.CONFIG_LOADER_CLASS(conf_source=conf_source, env=env, **settings.CONFIG_LOADER_ARGS)
        conf_catalog = loader["catalog"]
    except Exception:  # noqa: BLE001 - a catalog that cannot be read again: Kedro's own error stands
        return None
    return load_versions_error(options["load_versions"], conf_catalog)


def _node_tags(pipeline) -> list[str]:
    return sorted({tag for node in pipeline.nodes for tag in node.tags})


def _selected_names(pipelines: list[str], names_of) -> list[str]:
    """The names ``names_of`` gives for the pipelines a run selected (``__default__`` for none)."""
    from kedro.framework.project import pipelines as registered  # the project's, configured by the run

    found: list[str] = []
    for name in pipelines or ["__default__"]:
        found += [
            item for item in names_of(registered.get(name) or registered["__default__"]) if item not in found
        ]
    return found


def _unknown_option_names(
    options: dict, given: dict[str, str], known: list[str], what: str
) -> ConfigError | None:
    """The first of ``given``'s options (``{option: keyword}``) that names something not in ``known``."""
    for option, keyword in given.items():
        values = [part.strip() for value in options.get(keyword) or [] for part in str(value).split(",")]
        unknown = [value for value in values if value and value not in known]
        if unknown:
            return _unknown_name(option, unknown, known, what)
    return None


def _unknown_name(
    option: str,
    unknown: list[str],
    known: list[str],
    what: str,
    where: str = "this run's pipeline",
    matched: str | None = None,
) -> ConfigError:
    """``option`` naming ``unknown``, with the name of ``known`` closest to the first (or to ``matched``)."""
    close = difflib.get_close_matches(matched or unknown[0], known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return ConfigError(
        f"{option} {', '.join(unknown)}: no {what} of that name in {where}{hint}.",
        fix=f"use one of: {', '.join(known)}.",
    )


def unknown_pipelines_error(names: list[str]) -> ConfigError | None:
    """The one line for the names of ``names`` that are no pipeline of the project (with the close match and
    the pipelines there are), else None."""
    unknown = [name for name in names if importlib.util.find_spec(f"fastlm.pipelines.{name}") is None]
    if not unknown:
        return None
    known = sorted(info.name for info in pkgutil.iter_modules(fastlm.pipelines.__path__) if info.ispkg)
    close = [match for name in unknown for match in difflib.get_close_matches(name, known, n=1)]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return ConfigError(
        f"unknown pipeline {', '.join(unknown)!r}{hint}.", fix=f"use one of: {', '.join(known)}."
    )


def _pipeline_selection_error(exc: Exception, names: list[str]) -> FastlmError | None:
    """Kedro's ValueErrors for an unknown or empty pipeline, as one line."""
    message = str(exc)
    unknown = unknown_pipelines_error(names)
    if unknown is not None and isinstance(exc, ImportError | ValueError):
        return unknown
    if not isinstance(exc, ValueError):
        return None
    if "Pipeline contains no nodes" in message:
        return ConfigError(
            f"pipeline {', '.join(names) or '__default__'!r} has no nodes in this version of fastlm (or none "
            "left after your --tags/--nodes filters).",
            fix="run `kedro run --pipeline=split`, or check the filters.",
        )
    return None


def config_file(given: str) -> Path:
    """The ``--config`` file ``given``: as named from the working folder, else (a relative name) from the
    project folder, where a run works (``in_project_folder``) and where a sweep's ``sweep_best_run.yml`` is
    named from; neither: one line naming both places."""
    from kedro.utils import find_kedro_project

    path = Path(given)
    if path.is_file():
        return path.resolve()
    project = find_kedro_project(Path.cwd())
    if project is not None and not path.is_absolute() and (Path(project) / path).is_file():
        return (Path(project) / path).resolve()
    places = [Path.cwd().resolve()]
    if project is not None and not path.is_absolute() and Path(project).resolve() != places[0]:
        places.append(Path(project).resolve())
    raise _OneLine(
        ConfigError(
            f"--config {given}: no such file in {' nor in the project folder '.join(map(str, places))}.",
            fix="name a run configuration file such as data/08_reporting/sweep_best_run.yml (a sweep writes "
            "it), relative to the project folder or absolute.",
        )
    )


class _OneLine(click.ClickException):
    """A user error raised while click reads the options (before ``_run``): shown as ``_run`` shows one,
    ``fastlm: error: ...`` and its exit status, not click's ``Error:``."""

    def __init__(self, error: FastlmError):
        super().__init__(str(error))
        self.exit_code = error.exit_code

    def show(self, file=None) -> None:
        click.secho(f"fastlm: error: {redact_text(self.message)}", fg="red", err=True)


def _config_resolved(option: click.Parameter) -> click.Parameter:
    """Kedro's ``--config`` option, its file found by ``config_file`` before Kedro reads it (Kedro's own check
    looked in the working folder only, before the run moved to the project folder)."""
    if option.name != "config" or option.callback is None:
        return option
    kept = copy.copy(option)
    kept.type = click.Path(dir_okay=False)
    read = option.callback

    def callback(ctx: click.Context, param: click.Parameter, value):
        return read(ctx, param, str(config_file(value)) if value else value)

    kept.callback = callback
    return kept


run = click.Command(
    name="run",
    params=[_config_resolved(_params_text_kept(option)) for option in kedro_run.params],
    callback=_run,
    help=kedro_run.help,
    short_help=kedro_run.short_help,
)
cli.add_command(run)
