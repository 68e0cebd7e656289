"""YAML text of a pipeline file: a loader that refuses duplicate keys, readable syntax errors.

Used by :func:`cdc_lake.config.read_yaml` (every job kind), which wraps the message in a
:class:`cdc_lake.config.ConfigError` naming the file.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key twice in one mapping (PyYAML keeps the last one
    silently: a second ``sums:`` or ``keys:`` would replace the first without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # unhashable key: PyYAML's own error follows
                continue
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found the key {key!r} twice (first on line {first.line + 1}); PyYAML would "
                    "keep only the last one: remove or merge one of them", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def yaml_error_message(text: str, e: yaml.YAMLError, env_re: re.Pattern[str]) -> str:
    """A YAML syntax error as one line naming the line and column (PyYAML's own text says
    ``<unicode string>``); an unquoted ``${VAR}`` (``env_re``) in a flow mapping/sequence
    (``{...}``, ``[...]``: its braces are YAML syntax there) gets the fix named."""
    problem = getattr(e, "problem", None)
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    if problem is None or mark is None:
        return f"not valid YAML: {e}"
    context, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
    msg = f"line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {problem}"
    if context:
        msg += f" ({context}" + (f" that starts on line {cmark.line + 1}" if cmark else "") + ")"
    lines = text.splitlines()
    for m in (mark, cmark):
        line = lines[m.line] if m is not None and m.line < len(lines) else ""
        ref = env_re.search(line) or re.search(r"\$\{[^}\s]*\}?", line)
        if ref and not re.search(r"[\"']\$\{", line):
            key = re.search(r"([^\s{\[,:]+)\s*:\s*\$\{", line)
            example = f"{key.group(1)}: \"{ref.group(0)}\"" if key else f"\"{ref.group(0)}\""
            msg += (f". Line {m.line + 1} holds {ref.group(0)} unquoted, and inside {{...}} or [...] "
                    f"braces are YAML syntax: quote it, e.g. {example}")
            break
    return msg
