"""YAML reading: libyaml's C loader where PyYAML was built with it (several times faster on the
case files), the pure-Python safe loader otherwise. Both build the same plain data, and both
refuse a mapping that names a key twice (YAML lets the last one win without a word, so a second
block for the same component would silently replace the first)."""

from __future__ import annotations

import yaml
from yaml.constructor import ConstructorError

BASE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(BASE_LOADER):  # type: ignore[misc,valid-type]
    def construct_mapping(self, node, deep=False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: the base constructor says so
                    break
                if first is not key_node.start_mark:
                    raise ConstructorError(
                        "while reading a mapping",
                        node.start_mark,
                        f"key {key!r} appears twice (first at line {first.line + 1}); merge the two entries",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)


LOADER = _UniqueKeyLoader


def safe_load(text: str):
    return yaml.load(text, Loader=LOADER)  # noqa: S506 (a safe loader)
