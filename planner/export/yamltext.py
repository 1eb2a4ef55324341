"""YAML out: block style, keys in the order built, a header comment on top."""

from __future__ import annotations

from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # Multi-line strings (PromQL, scripts) stay readable as literal blocks.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(*documents: dict[str, Any]) -> str:
    """One or more YAML documents, separated by `---`."""
    return "---\n".join(
        yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120) for doc in documents
    )
