"""YAML read as PyYAML's safe loader reads it, but a key a mapping writes twice refused (``KeyTwice``, with
its line) where PyYAML keeps the last value and loses the first, as Kedro's config loader (OmegaConf's)
refuses one in the conf files. Used for the files read outside that loader: sweep files
(``fastlm.sweeps.load_sweep``, with the conf files' numbers: ``load_as_conf``) and conf/logging.yml
(``fastlm.cli.project_logging``, which Kedro reads with PyYAML)."""

from __future__ import annotations

import re

import yaml


class KeyTwice(yaml.YAMLError):
    """A mapping that writes one key twice, at ``line`` (1-based: the second time)."""

    def __init__(self, key, line: int) -> None:
        super().__init__(f"line {line} writes the key {key!r} twice")
        self.key, self.line = key, line


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader refusing a key a mapping writes twice (``KeyTwice``); a merge key (``<<``) is not
    a key of its own."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise KeyTwice(key, key_node.start_mark.line + 1)
                seen.add(key)
            except TypeError:  # an unhashable key: PyYAML's own error names it
                continue
        return super().construct_mapping(node, deep)


def load_unique_keys(text: str):
    """``text`` read as ``yaml.safe_load`` reads it, a key a mapping writes twice raising ``KeyTwice``."""
    return yaml.load(text, Loader=UniqueKeyLoader)


# OmegaConf's reading of a float (Kedro's conf files, --params): YAML 1.2's, where 1e-4 is a number (PyYAML's
# YAML 1.1 needs a dot: 1.0e-4); OmegaConf reads no timestamps either (2024-01-01 stays text).
_CONF_FLOAT = re.compile(
    r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class ConfKeyLoader(UniqueKeyLoader):
    """:class:`UniqueKeyLoader` reading scalars as the conf files' loader (OmegaConf's) reads them."""


ConfKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, rule) for tag, rule in rules if tag not in ("tag:yaml.org,2002:float", _TIMESTAMP)]
    for first, rules in UniqueKeyLoader.yaml_implicit_resolvers.items()
}
ConfKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", _CONF_FLOAT, list("-+0123456789."))


def load_as_conf(text: str):
    """``text`` read as a conf file is (``1e-4`` a number, ``2024-01-01`` text), a key a mapping writes twice
    raising ``KeyTwice``: a file beside the conf files that Kedro's loader does not read (a sweep file)."""
    return yaml.load(text, Loader=ConfKeyLoader)


def conf_numbers(value):
    """``value`` with each text in exponent form (``'1e-3'``, ``'1.0e3'``: what PyYAML's reading of a sweep
    file gave as text before ``load_as_conf``) as the number a conf file reads, in lists and mappings too."""
    if isinstance(value, dict):
        return {key: conf_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [conf_numbers(item) for item in value]
    if isinstance(value, str) and _EXPONENT.match(value):
        return float(value)
    return value


_EXPONENT = re.compile(r"^[-+]?[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+$")  # the floats PyYAML reads as text
