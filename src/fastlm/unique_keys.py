"""YAML read as PyYAML's safe loader reads it, but a key a mapping writes twice refused (``KeyTwice``, with
its line) where PyYAML keeps the last value and loses the first, as Kedro's config loader (OmegaConf's)
refuses one in the conf files. Used for the files read outside that loader: sweep files
(``fastlm.sweeps.load_sweep``) and conf/logging.yml (``fastlm.cli.project_logging``)."""

from __future__ import annotations

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
