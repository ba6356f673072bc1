"""YAML reading: libyaml's C loader where PyYAML was built with it (several times faster on the
case files), the pure-Python safe loader otherwise. Both build the same plain data."""

from __future__ import annotations

import yaml

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str):
    return yaml.load(text, Loader=LOADER)  # noqa: S506 (a safe loader)
