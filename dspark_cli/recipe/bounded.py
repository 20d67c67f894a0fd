"""Reading YAML and JSON that come from outside (recipes, a draft's recipe, prompt files), with bounds.

    text = read_text(path, "recipe", MAX_RECIPE_BYTES)   # size checked before reading; not UTF-8: one line
    tree = parse_yaml(text, "my.yaml")                   # aliases, nesting and node count bounded
    data = parse_json(text, "prompts.json")              # nesting too deep: one line, not a RecursionError
    config = read_json(Path("draft/config.json"))        # files from outside: too deep is a JSONDecodeError

A key written twice in one mapping (`train:` twice, `lr:` twice in a section) is refused, naming the key,
both lines and the source: YAML would silently keep the last value.

A YAML alias bomb (`b: &b [*a, *a, ...]` nine levels deep is 1e9 elements) parses into a few shared
nodes and then costs minutes and gigabytes in whatever walks it (validation, dumping): the composed
node graph is measured, aliases expanded, before anything is built from it. Every failure is one
`UsageError` naming the source.

A JSON file from outside (a draft's or a target's config.json, a manifest, a bench report) nested 50,000
deep makes `json.loads` raise RecursionError, and one nested a few hundred deep parses but then breaks
whatever walks it (a YAML dump, a pydantic model). `read_json` / `loads_json` refuse nesting deeper than
MAX_JSON_NESTING as a `json.JSONDecodeError` at the bracket that goes too deep, so every reader's existing
one line for invalid JSON ("FILE: invalid JSON (...)") covers it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from dspark_cli.errors import UsageError

MAX_RECIPE_BYTES = 1 << 20  # the shipped recipes are ~5 KB
MAX_YAML_NODES = 100_000  # values, keys and items after aliases are expanded (a recipe has ~300)
MAX_NESTING = 64  # mappings and lists inside each other (a recipe nests 4 deep)
MAX_JSON_NESTING = 64  # arrays and objects inside each other (a config, manifest or report nests < 10 deep)


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that also reads `3e-4` as a float (YAML 1.1 insists on `3.0e-4`) and refuses a document
    whose node graph, aliases expanded, is larger than MAX_YAML_NODES or nests deeper than MAX_NESTING,
    or that writes a key twice in one mapping."""

    def compose_document(self):
        node = super().compose_document()
        _measure(node)
        _refuse_duplicate_keys(node)
        return node


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


class _TooBig(Exception):
    pass


def _measure(root: yaml.Node) -> None:
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node, depth: int) -> int:
        if depth > MAX_NESTING:
            raise _TooBig(f"nested deeper than {MAX_NESTING} levels")
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise _TooBig("an alias refers to a node that contains it (a recursive alias)")
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k, depth + 1) + size(v, depth + 1) for k, v in node.value)
        if total > MAX_YAML_NODES:
            raise _TooBig(f"more than {MAX_YAML_NODES:,} values once its aliases are expanded (an alias bomb?)")
        open_nodes.discard(key)
        sizes[key] = total
        return total

    if root is not None:
        size(root, 0)


class _DuplicateKey(Exception):
    def __init__(self, key: str, first: int, second: int) -> None:
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


def _refuse_duplicate_keys(root: yaml.Node | None) -> None:
    """Raise `_DuplicateKey` (dotted key path, both 1-based lines) for the first scalar key written twice
    in one mapping. A merge key (`<<: *base`) is YAML's own override and is left alone. Runs after
    `_measure`, so the graph walked is bounded; a node shared through aliases is walked once."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")] if root is not None else []
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            lines: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                name = str(key.value) if isinstance(key, yaml.ScalarNode) else None
                here = f"{path}.{name}" if path and name is not None else name or path
                if name is not None and key.tag != "tag:yaml.org,2002:merge":
                    line = key.start_mark.line + 1
                    if (key.tag, name) in lines:
                        raise _DuplicateKey(here, lines[key.tag, name], line)
                    lines[key.tag, name] = line
                stack.append((value, here))


def read_text(path: str | os.PathLike[str], what: str, max_bytes: int) -> str:
    """The UTF-8 text of `path`, refused in one line when larger than `max_bytes` (checked before reading)
    or not UTF-8."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise UsageError(
                f"{path}: {size:,} bytes, more than a {what} may be ({max_bytes:,})",
                f"is this the right file? a {what} is a small YAML text file",
            )
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or type(exc).__name__}", "check the path") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UsageError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); a {what} is UTF-8 YAML",
            "save it as UTF-8 (or pass the right file)",
        ) from None


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text; a syntax error, an alias bomb or too deep a nesting is one line naming `source`."""
    try:
        return yaml.load(text, Loader=_YamlLoader)  # a SafeLoader subclass
    except _DuplicateKey as exc:
        where = f"twice on line {exc.first}" if exc.first == exc.second else f"lines {exc.first} and {exc.second}"
        raise UsageError(
            f"{source}:{exc.second}: duplicate key {exc.key} ({where}); YAML would silently keep the last value",
            f"keep one `{exc.key.rsplit('.', 1)[-1]}:` and delete the other",
        ) from None
    except _TooBig as exc:
        raise UsageError(f"{source}: refused: {exc}", "write the values out; a recipe needs no deep aliases") from None
    except RecursionError:
        raise UsageError(f"{source}: refused: nested too deeply to read", "a recipe nests a few levels") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{source}{where}: invalid YAML: {problem}", "fix the syntax and run again") from None


def parse_json(text: str | bytes, source: str) -> Any:
    """`json.loads`, with nesting too deep for Python (a RecursionError) as one line naming `source`;
    a syntax error stays a `json.JSONDecodeError` for the caller to word."""
    try:
        return json.loads(text)
    except RecursionError:
        raise UsageError(
            f"{source}: JSON nested too deeply to read (thousands of levels)",
            "a record is an object of messages a few levels deep; fix or drop it",
        ) from None


_JSON_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')  # strings whole (their brackets are text), brackets


def _nesting_exceeded_at(data: bytes, limit: int) -> int:
    """The offset of the first bracket nested deeper than `limit` in JSON `data` (0 when none is)."""
    depth = 0
    for match in _JSON_TOKENS.finditer(data):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return match.start()
        elif token in (b"]", b"}"):
            depth -= 1
    return 0


def _nested_deeper(value: Any, limit: int) -> bool:
    """Whether parsed JSON `value` has arrays/objects more than `limit` deep (walked without recursion)."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def loads_json(data: str | bytes, *, max_nesting: int = MAX_JSON_NESTING) -> Any:
    """`json.loads` for JSON from outside: nesting deeper than `max_nesting` (which includes any too deep
    for Python to read), or bytes that are not UTF-8, raise `json.JSONDecodeError` (a ValueError) at the
    offending offset, as a syntax error does; callers word all three in one line naming their file."""
    try:
        value = json.loads(data)
    except RecursionError:
        value = None
    except UnicodeDecodeError as exc:  # bytes only: a str was decoded already
        text = exc.object[: exc.start].decode("utf-8", "replace")
        raise json.JSONDecodeError(
            f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x})", f"{text}?", len(text)
        ) from None
    else:
        if not _nested_deeper(value, max_nesting):
            return value
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    offset = _nesting_exceeded_at(raw, max_nesting)
    text = raw.decode("utf-8", "replace")
    position = len(raw[:offset].decode("utf-8", "replace"))
    raise json.JSONDecodeError(f"nested deeper than {max_nesting} levels", text, position)


def read_json(path: str | os.PathLike[str], *, max_nesting: int = MAX_JSON_NESTING) -> Any:
    """The JSON value in the file `path` (`loads_json`: too deep or not UTF-8 is a `json.JSONDecodeError`);
    an unreadable file is the OSError."""
    return loads_json(Path(path).read_bytes(), max_nesting=max_nesting)
