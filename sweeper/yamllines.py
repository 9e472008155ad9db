"""A YAML mapping read with the 1-based line of every key, for errors that say where.

Spaces and the GPU catalog are files people write by hand: a mistake is named
``file:line: field: problem``. ``load`` reads the text once as data and once as nodes (whose marks
hold the lines), refuses what YAML itself refuses and a key written twice (YAML keeps the last
silently), each with its line; ``line_for`` finds the line of a field an error names, or of its
nearest parent that was written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

Lines = dict[tuple[Any, ...], int]


def load(text: str, source: str, error: type[Exception]) -> tuple[Any, Lines]:
    """The YAML ``text``'s data and its keys' lines; ``error`` (a ``SweeperError``) naming
    ``source:line`` for invalid YAML and for a key that appears twice."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        # where the structure it broke began (an unclosed [ or {, a mapping a line's indent
        # left), when that is another line than the one where YAML noticed
        context, opened = getattr(e, "context", None), getattr(e, "context_mark", None)
        began = (
            f" ({context}, which starts on line {opened.line + 1})"
            if context and opened is not None and (mark is None or opened.line != mark.line)
            else ""
        )
        raise error(f"{where}: not valid YAML: {getattr(e, 'problem', e)}{began}") from e
    lines: Lines = {}
    if root is not None:
        _key_lines(root, (), lines, source, error)
    return data, lines


def _key_lines(
    node: yaml.Node, path: tuple[Any, ...], out: Lines, source: str, error: type[Exception]
) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key, line = key_node.value, key_node.start_mark.line + 1
            if key in seen:
                raise error(
                    f"{source}:{line}: {dotted((*path, key))}: key appears twice "
                    f"(lines {seen[key]} and {line}); keep one"
                )
            seen[key] = line
            out[(*path, key)] = line
            _key_lines(value_node, (*path, key), out, source, error)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _key_lines(item, (*path, index), out, source, error)


def dotted(loc: tuple[Any, ...]) -> str:
    """A field's place as written in errors: ``search.attn_implementation[1]``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def line_for(loc: tuple[Any, ...], lines: Mapping[tuple[Any, ...], int]) -> int:
    """The line of ``loc``, or of its nearest parent that the file wrote (1 if none)."""
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in lines:
            return lines[loc[:cut]]
    return 1
