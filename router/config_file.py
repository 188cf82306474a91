"""Reading a config file that may be hostile: bounded in size, encoding, depth and aliases.

PyYAML's `SafeLoader` builds no Python objects from tags, but left alone it
reads a file of any size, recurses once per nesting level (10,000 levels
are a RecursionError) and composes an alias bomb in a blink, whose
expansion then takes every later walk of the tree minutes and gigabytes.
`read_yaml` refuses each of these within milliseconds, as a `ConfigError`
naming the file (and the line, for what YAML itself reports).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from providers.errors import ConfigError

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_VALUES", "read_yaml"]

MAX_BYTES = 256 * 1024  # a chain of dozens of entries with comments is a few KiB
MAX_DEPTH = 32  # the deepest real config is 5 levels (chain[i].options.x)
MAX_VALUES = 10_000  # scalars and collections, aliases counted as expanded


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that also rejects duplicate keys, deep nesting and alias bombs.

    Each composed node's expanded size (itself plus its children, aliases
    expanded) is remembered, so an alias costs its whole subtree without
    being expanded.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._values = 0
        self._sizes: dict[int, int] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        start: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]  # unannotated in types-PyYAML
        if isinstance(start, yaml.AliasEvent):
            target = self.anchors.get(start.anchor)
            if target is not None:
                size = self._sizes.get(id(target))
                if size is None:
                    raise _refused("an alias refers to a value that contains it", start)
                self._count(size, start)
            return super().compose_node(parent, index)
        if self._depth >= MAX_DEPTH:
            raise _refused(f"nested deeper than {MAX_DEPTH} levels", start)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node is None:
            return None
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        self._sizes[id(node)] = 1 + sum(self._sizes[id(child)] for child in children)
        self._count(1, start)
        return node

    def _count(self, size: int, event: yaml.Event) -> None:
        self._values += size
        if self._values > MAX_VALUES:
            raise _refused(f"more than {MAX_VALUES} values with aliases expanded", event)


class _Refused(Exception):
    """Valid YAML this router will not read: the message and the line where it showed."""

    def __init__(self, problem: str, line: int) -> None:
        super().__init__(f"{problem} (line {line})")


def _refused(problem: str, event: yaml.Event) -> _Refused:
    return _Refused(problem, event.start_mark.line + 1 if event.start_mark else 0)


def _mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_BoundedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def read_yaml(path: str | Path) -> Any:
    """The YAML document in ``path``, or a ConfigError saying why it is refused."""
    where = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read config: {exc.strerror}") from exc
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_BYTES // 1024} KiB; not a chain file?")
    if (nul := data.find(b"\0")) >= 0:
        raise ConfigError(f"{where}: binary file (a NUL byte at offset {nul}); expected YAML")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    try:
        return yaml.load(text, Loader=_BoundedLoader)
    except _Refused as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: invalid YAML: {exc}") from None
