"""The one registry of parameter groups: which ``conf/base/parameters_<group>.yml`` group is validated by
which schema. Hooks validate every group a run reads before any node runs; nodes parse their groups
through :func:`parse_group`; a test checks that each file parses to its schema's defaults.

Kedro-free. The schema modules are imported only for the groups asked for (the tune package imports torch).
"""

from __future__ import annotations

import difflib
import importlib
import mimetypes
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastlm.errors import ConfigError


@dataclass(frozen=True)
class ParameterGroup:
    """A top-level key of the parameters files and the function that validates its value."""

    name: str
    module: str
    parser: str  # module-level function: raw value -> validated object (one ConfigError line on bad input)
    # the pydantic class whose defaults the conf/base file spells out (None: not a mapping)
    schema: str | None

    @property
    def source(self) -> str:
        return f"conf/base/parameters_{self.name}.yml"

    def parse(self, raw: Any) -> Any:
        return getattr(importlib.import_module(self.module), self.parser)(raw)

    def defaults(self) -> Any:
        """The schema's defaults (what the group's conf/base file must spell out)."""
        if self.schema is None:
            raise TypeError(f"parameter group {self.name} has no schema with defaults")
        return getattr(importlib.import_module(self.module), self.schema)()


GROUPS: dict[str, ParameterGroup] = {
    group.name: group
    for group in (
        ParameterGroup("split", "fastlm.corpus.config", "parse_split_params", "SplitParams"),
        ParameterGroup("train", "fastlm.engine.config", "parse_train_params", "TrainParams"),
        ParameterGroup("report", "fastlm.reporting.params", "parse_report_params", "ReportParams"),
        ParameterGroup("tune", "fastlm.pipelines.tune.params", "parse_tune_params", "TuneParams"),
        ParameterGroup("predict", "fastlm.pipelines.predict.params", "parse_predict_params", "PredictParams"),
        ParameterGroup("sweep", "fastlm.sweeps", "load_sweep", None),  # a path to a sweep file
    )
}


def parse_group(name: str, raw: Any) -> Any:
    """``raw`` (the ``params:<name>`` value) validated by the group's schema."""
    return GROUPS[name].parse(raw)


# Top-level parameters nodes read without a group schema (resolved and checked by fastlm.hooks.RunNameHook).
PLAIN = ("run_name",)
_CONF_SUFFIXES = {".yml", ".yaml", ".json"}
_RUNTIME_PARAM = re.compile(r"\$\{runtime_params:\s*([^,}.\s]+)")


def known_top_level_params(conf_root: Path) -> set[str]:
    """Every top-level key ``--params`` may set: the groups and :data:`PLAIN`, the top-level keys of every
    parameters file of every environment under ``conf_root`` (the files Kedro reads as parameters:
    ``parameters*``, ``parameters*/**``, ``**/parameters*``), and every ``${runtime_params:NAME}`` a conf file
    reads (``raw_path`` in catalog.yml). Read as YAML: no pipeline module is imported for this."""
    names = {*GROUPS, *PLAIN}
    for _, read, keys in _conf_files(conf_root):
        names.update(read)
        names.update(keys)
    return names


def runtime_only_params(conf_root: Path) -> dict[str, list[str]]:
    """Per name a conf file reads through ``${runtime_params:NAME}`` (``raw_path`` in catalog.yml), the
    parameters files under ``conf_root`` that set it at their top level: Kedro hands such files to the nodes,
    never to that resolver, so the value would be dropped."""
    read, set_in = set(), {}
    for file, reads, keys in _conf_files(conf_root):
        read.update(reads)
        for key in keys:
            set_in.setdefault(key, []).append(str(file.relative_to(Path(conf_root).parent)))
    return {name: files for name, files in set_in.items() if name in read}


def env_parameters(loader, env: str) -> dict:
    """The parameters of the conf environment ``env`` alone, as the run's config ``loader`` (Kedro's
    OmegaConfigLoader) reads them: its file patterns, ``${globals:...}``, resolvers and interpolations, the
    run's ``--params`` merged over them. Empty where the loader's conf source has no such folder (a packed
    conf without that environment)."""
    source, patterns = str(loader.conf_source), loader.config_patterns["parameters"]
    if packed_conf(source):  # read through the loader's own view of the archive
        root = packed_conf_folder(source)
        try:
            return loader.load_and_merge_dir_config(f"{root}/{env}", patterns, "parameters", set()) or {}
        except Exception:  # noqa: BLE001 - no such environment in it, or no readable archive
            return {}
    folder = Path(source) / env
    if not folder.is_dir():
        return {}
    return loader.load_and_merge_dir_config(str(folder), patterns, "parameters", set()) or {}


def setting_file(conf_root: Path, env: str, message: str) -> Path | None:
    """The parameters file of the environment ``env`` under ``conf_root`` (Kedro's parameters patterns:
    ``parameters*``, ``parameters*/**``, ``**/parameters*``) that sets a parameter ``message`` names: one of
    its values (``train.optimizer.lr``, ``report.prompts``) written there as a whole name. None where no
    file of it does (the value is conf/base's, a default, or given with ``--params``)."""
    for file, loaded in parameters_files(Path(conf_root) / env):
        if named_in(loaded, message):
            return file
    return None


def parameters_files(folder: Path):
    """Each parameters file of the conf environment ``folder`` (Kedro's parameters patterns:
    ``parameters*``, ``parameters*/**``, ``**/parameters*``), in name order, with what it holds as YAML;
    files that do not read are left to the run's config loader, which says what is wrong with them."""
    import yaml

    if not folder.is_dir():
        return
    for file in sorted(folder.rglob("*")):
        if not file.is_file() or file.suffix not in _CONF_SUFFIXES:
            continue
        if not any(part.startswith("parameters") for part in file.relative_to(folder).parts):
            continue
        try:
            loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        yield file, loaded


def named_in(values: Any, message: str) -> list[str]:
    """The dotted names of ``values`` (a parameters mapping: a file's, or the run's ``--params``) that
    ``message`` names as a whole name (``train.optimizer.lr``, not ``train.optimizer`` of it), or that lie
    under a key it calls an unknown parameter (``train.optimzer.lr`` of ``unknown parameter train.optimzer``:
    a misspelled group, written only where its values are); the name a "did you mean" suggests is not one."""
    message = _SUGGESTED.sub("", message)  # the key suggested is not the one set
    unknown = [name.rstrip(".") + "." for name in _UNKNOWN.findall(message)]
    return [
        name
        for name in _leaves(values)
        if re.search(rf"(?<![\w.]){re.escape(name)}(?!\w|\.\w)", message) or name.startswith(tuple(unknown))
    ]


_UNKNOWN = re.compile(r"unknown parameter ([\w.]+)")  # validation.parse_params's line for a misspelled key
_SUGGESTED = re.compile(r" \(did you mean [^)]*\)")


def _leaves(value: Any, prefix: str = "") -> list[str]:
    """The dotted names of the values of a parameters file's mapping (``{train: {max_steps: 3}}`` ->
    ``["train.max_steps"]``)."""
    if not isinstance(value, Mapping) or (not value and prefix):
        return [prefix] if prefix else []
    return [name for key, child in value.items() for name in _leaves(child, f"{prefix}.{key}".lstrip("."))]


def packed_conf(source: str) -> bool:
    """Whether ``source`` (a ``--conf-source``) is a packed conf, a tar or zip archive, by its name as Kedro's
    config loader tells one."""
    kind, _ = mimetypes.guess_type(source)
    return kind in ("application/x-tar", "application/zip", "application/x-zip-compressed")


def packed_conf_folder(source: str) -> str | None:
    """The conf folder inside the packed conf ``source`` as Kedro's loader finds it (the archive's last
    top-level entry); None for an archive that cannot be read (the loader says so when it reads it)."""
    import fsspec

    try:
        protocol = "tar" if mimetypes.guess_type(source)[0] == "application/x-tar" else "zip"
        return str(fsspec.filesystem(protocol, fo=source).ls("", detail=False)[-1])
    except Exception:  # noqa: BLE001 - a broken archive is Kedro's to report
        return None


def packed_conf_file(source: str, path: str) -> bytes | None:
    """The bytes of ``path`` (relative to the conf folder) in the packed conf ``source``; None where it holds
    no such file or cannot be read."""
    import fsspec

    root = packed_conf_folder(source)
    if root is None:
        return None
    try:
        protocol = "tar" if mimetypes.guess_type(source)[0] == "application/x-tar" else "zip"
        files = fsspec.filesystem(protocol, fo=source)
        member = f"{root}/{path}"
        return files.cat_file(member) if files.isfile(member) else None
    except Exception:  # noqa: BLE001 - a broken archive is Kedro's to report
        return None


def _conf_files(conf_root: Path):
    """Per conf file of every environment under ``conf_root``: (its path, the ``${runtime_params:NAME}``
    names it reads, its top-level keys where it is a parameters file, else none)."""
    import yaml

    for env in (path for path in sorted(Path(conf_root).iterdir()) if path.is_dir()):
        for file in sorted(env.rglob("*")):
            if not file.is_file() or file.suffix not in _CONF_SUFFIXES:
                continue
            try:
                text = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            keys: list[str] = []
            if any(part.startswith("parameters") for part in file.relative_to(env).parts):
                try:
                    loaded = yaml.safe_load(text)
                except yaml.YAMLError:
                    loaded = None  # Kedro reports the file itself
                keys = [str(key) for key in loaded] if isinstance(loaded, dict) else []
            yield file, _RUNTIME_PARAM.findall(text), keys


def unread_parameters_files(
    conf_root: Path, envs: Sequence[str], patterns: Mapping[str, Sequence[str]]
) -> list[tuple[Path, list[str], Path]]:
    """The conf files of the environments ``envs`` under ``conf_root`` that set parameters (a group or a plain
    parameter at their top level) but that the config loader reads under none of its ``patterns`` (Kedro reads
    parameters from ``parameters*`` files alone: ``parameter_split.yml``, ``params.yml`` and
    ``Parameters.yml`` are dropped without a word): each with those keys and the name it would be read under.
    Sweep files (a ``sweeps`` folder), read by name, are none."""
    import glob

    import yaml

    names = {*GROUPS, *PLAIN}
    found = []
    for env in dict.fromkeys(envs):
        folder = Path(conf_root) / env
        if not folder.is_dir():
            continue
        read = {
            Path(path).resolve()
            for listed in patterns.values()
            for pattern in listed
            for path in glob.glob(str(folder / pattern), recursive=True)
        }
        for file in sorted(folder.rglob("*")):
            if not file.is_file() or file.suffix.lower() not in _CONF_SUFFIXES or file.resolve() in read:
                continue
            if "sweeps" in file.relative_to(folder).parts:
                continue
            try:
                loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                continue
            keys = sorted(str(key) for key in loaded if str(key) in names) if isinstance(loaded, dict) else []
            if keys:
                rest = re.sub(r"(?i)^param(?:eter)?s?", "", file.stem).lstrip("_-")
                renamed = file.with_name(f"parameters_{rest}" if rest else "parameters").with_suffix(
                    file.suffix.lower()
                )
                found.append((file, keys, renamed))
    return found


_INTERPOLATION = re.compile(r"\$\{\s*([A-Za-z_][\w-]*)")  # ${name...}: a key a conf file reads


def misread_top_level_keys(
    conf_root: Path, envs: Sequence[str], read: set[str]
) -> list[tuple[Path, str, str]]:
    """The top-level keys of the parameters files of the environments ``envs`` under ``conf_root`` that no
    node reads (``read``: the names nodes take as ``params:<name>``; the groups and :data:`PLAIN`) and no conf
    file interpolates, but that look meant for one: a near miss of such a name (``spilt``, ``Train``) or a
    dotted key whose first part is one (``split.max_samples: 99``, one name, not a path). Each with the file
    and the name meant. A name of the user's own is left alone."""

    known = sorted({*GROUPS, *PLAIN, *read})
    interpolated: set[str] = set()
    for _, reads, _ in _conf_files(conf_root):
        interpolated.update(reads)
    for env in (path for path in sorted(Path(conf_root).iterdir()) if path.is_dir()):
        for file in env.rglob("*"):
            if file.is_file() and file.suffix in _CONF_SUFFIXES:
                try:
                    interpolated.update(_INTERPOLATION.findall(file.read_text(encoding="utf-8")))
                except (OSError, UnicodeDecodeError):
                    continue
    found = []
    for env in dict.fromkeys(envs):
        for file, loaded in parameters_files(Path(conf_root) / env):
            for key in loaded if isinstance(loaded, dict) else ():
                key = str(key)
                if key in known or key in interpolated:
                    continue
                first = key.split(".", 1)[0]
                meant = (
                    first
                    if first in known
                    else next(iter(difflib.get_close_matches(first.lower(), known, n=1, cutoff=0.75)), None)
                )
                if meant is not None:
                    found.append((file, key, meant))
    return found


def check_top_level_params(given: Mapping[str, Any], known: set[str]) -> None:
    """One ConfigError line for the first top-level key of ``given`` (``--params``) outside ``known``.

    Such a key reaches no node and no catalog entry: a misspelled one (``raw_pth``, ``trian.max_steps``) would
    otherwise leave the run on its defaults, e.g. re-splitting the demo corpus instead of the user's file.
    """
    values = {str(key): value for key, value in given.items()}
    unknown = sorted(key for key in values if key not in known)
    if not unknown:
        return
    key = unknown[0]
    leaf = _only_leaf(values[key])
    shown = ".".join((key, *leaf))
    close = difflib.get_close_matches(key, sorted(known), n=1)
    suggestion = ".".join((close[0], *leaf)) if close else None
    more = f" (and {len(unknown) - 1} more: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
    hint = f" (did you mean {suggestion}?)" if suggestion else ""
    use = f"use {suggestion}" if suggestion else f"use one of {', '.join(sorted(known))}"
    raise ConfigError(
        f"unknown parameter {shown}{hint} in --params{more}: no parameters file under conf/ defines {key} "
        "and no catalog entry reads it, so it would be ignored.",
        fix=f"{use}, or define {key} in a conf/<env>/parameters*.yml file if a node or catalog entry of your "
        "own reads it.",
    )


def _only_leaf(value: Any) -> tuple[str, ...]:
    """The key path of ``value``'s one leaf (``{max_steps: 3}`` -> ``(max_steps,)``), else ()."""
    path: list[str] = []
    while isinstance(value, Mapping) and len(value) == 1:
        name, value = next(iter(value.items()))
        path.append(str(name))
    return tuple(path) if not isinstance(value, Mapping) else ()


RAW_PARAMS = "fastlm.raw_params"  # click context meta: the --params text as typed (set by fastlm.cli)
_FILE_LINE = r"^\s*(?:-\s+)?(['\"]?){key}\1\s*:\s+(?P<text>[^#\s'\"{{\[][^#]*?)\s*(?:\s#.*)?$"


def written_text(name: str, value: Any) -> str | None:
    """The text the value ``value`` of the dotted parameter ``name`` was typed as, unquoted, where it can be
    found: its ``--params`` item (or its ``--config`` file's ``run.params``), else the line of a parameters
    file under ./conf that writes it; None where it is found nowhere, or files write it differently. YAML
    reads ``0042`` as 34 and ``1.50`` as 1.5, so a fix quoting the value read would change it."""
    given = [text for text in _given_texts(name) if _reads_as(text, value)]
    if given:
        return given[-1]  # the last item given is the one Kedro keeps
    written = {text for text in _file_texts(name) if _reads_as(text, value)}
    return written.pop() if len(written) == 1 else None


def _given_texts(name: str) -> list[str]:
    """The values typed for ``name`` in the running ``kedro run``'s ``--params`` text (or its ``--config``
    file's ``run.params`` text), as typed; none outside the command."""
    try:
        import click
    except ImportError:
        return []
    context = click.get_current_context(silent=True)
    if context is None:
        return []
    texts = [context.meta.get(RAW_PARAMS), (context.default_map or {}).get("params")]
    found = []
    for text in texts:
        if isinstance(text, str):
            for item in params_items(text):
                key, equals, typed = item.partition("=")
                if equals and key.strip() == name:
                    found.append(typed.strip())
    return found


def _file_texts(name: str) -> list[str]:
    """The texts of the lines of the parameters files under ./conf (each environment's) that write ``name``
    (its last key, in a file whose value at ``name`` is set)."""
    conf = Path("conf")
    if not conf.is_dir():
        return []
    keys = name.split(".")
    line = re.compile(_FILE_LINE.format(key=re.escape(keys[-1])), re.MULTILINE)
    texts = []
    for folder in sorted(path for path in conf.iterdir() if path.is_dir()):
        for file, loaded in parameters_files(folder):
            value = loaded
            for key in keys:
                value = value.get(key) if isinstance(value, Mapping) else None
            if value is None:
                continue
            try:
                texts += [match["text"] for match in line.finditer(file.read_text(encoding="utf-8"))]
            except (OSError, UnicodeDecodeError):
                continue
    return texts


def _reads_as(text: str, value: Any) -> bool:
    """Whether ``text``, read as Kedro reads a ``--params`` value or a file's (OmegaConf's YAML), is
    ``value`` (of its type: 1 is not True)."""
    from omegaconf import OmegaConf

    try:
        read = OmegaConf.to_container(OmegaConf.from_dotlist([f"value={text}"]))["value"]
    except Exception:  # noqa: BLE001 - a text OmegaConf does not read is not the value
        return False
    return type(read) is type(value) and read == value


_OPENS_A_VALUE = ("", "=", "[", "{", ",", ":")  # what precedes a quote that starts a quoted YAML value


def params_items(text: str) -> list[str]:
    """``--params`` text cut into its ``key=value`` items at the commas outside brackets, braces and quoted
    values, so that a list or mapping keeps its commas (``target_modules=[q_proj,v_proj]``,
    ``report.prompts=["Hello, world"]``); Kedro cuts at every comma (kedro-org/kedro#2552: the list was
    refused as "Item `v_proj]` must contain a key and a value"). A text whose brackets or quotes do not
    close is cut at every comma, as Kedro cuts it."""
    items, start, depth, quote = [], 0, 0, None
    for at, char in enumerate(text):
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"" and text[:at].rstrip()[-1:] in _OPENS_A_VALUE:
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth < 0:
                break
        elif char == "," and depth == 0:
            items.append(text[start:at])
            start = at + 1
    else:
        if depth == 0 and quote is None:
            return [item.strip() for item in [*items, text[start:]] if item.strip()]
    return [item.strip() for item in text.split(",") if item.strip()]
