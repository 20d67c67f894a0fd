"""Read prompt sources: local JSONL / JSON / Parquet files, bundled prompt sets, Hugging Face datasets.

    for conv in read_source(PromptSource(path="prompts.jsonl")):
        ...

Records become `Conversation`s (see conversation.py). Every problem is one `UsageError` line naming
the file (and line) and what to do: a missing file, an empty source, a record in an unknown schema,
a missing field, a dataset that cannot be fetched offline.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dspark_cli.errors import UsageError
from dspark_cli.prompts.conversation import Conversation, content_digest, to_conversation
from dspark_cli.recipe.bounded import parse_json
from dspark_cli.recipe.schema import PromptSource

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
_JSON_HINT = "fix that line: a .jsonl source holds one JSON record per line, a .json source a list of records"


def source_name(source: PromptSource) -> str:
    """A short stable label for reports and ids: the file name or dataset name (+ subset/split)."""
    path = source.path
    label = Path(path).name if _looks_local(path) else path
    if source.subset:
        label += f":{source.subset}"
    if not _looks_local(path) and source.split != "train":
        label += f"[{source.split}]"
    return label


def source_labels(sources: list[PromptSource], field: str = "datagen.sources") -> list[str]:
    """Distinct labels for `sources` (conversation ids are `label#id`): `source_name`, or the path as written
    where two files share a name (`srcA/p.jsonl`, `srcB/p.jsonl`). A source listed twice is a UsageError."""

    def identity(source: PromptSource) -> tuple[str, str, str | None]:
        path = source.path
        if _bundled(path) is None and _looks_local(path):
            path = str(Path(path).expanduser().resolve())
        return path, source.split, source.subset

    seen: dict[tuple[str, str, str | None], int] = {}
    for index, source in enumerate(sources):
        first = seen.setdefault(identity(source), index)
        if first != index:
            raise UsageError(
                f"{field}[{index}] ({source.path}) repeats {field}[{first}]: its conversations would be read twice",
                "list each source once (max_samples limits how many are taken)",
            )
    labels = [source_name(s) for s in sources]
    for index, source in enumerate(sources):
        if labels.count(labels[index]) > 1 and _bundled(source.path) is None and _looks_local(source.path):
            labels[index] = os.path.normpath(source.path) + (f":{source.subset}" if source.subset else "")
    for index, label in enumerate(labels):
        if labels.index(label) != index:
            raise UsageError(
                f"{field}[{index}] ({sources[index].path}) and {field}[{labels.index(label)}] have the "
                f"same label {label!r}, so their conversation ids would collide",
                "give the files distinct paths",
            )
    return labels


def read_source(source: PromptSource, label: str | None = None) -> Iterator[Conversation]:
    """Yield the conversations of one source, in file order, at most `max_samples`. Ids are unique in a
    source: a record repeating another's id is a UsageError (records without one are told apart by content,
    and exact repeats numbered: dedup drops them later)."""
    label = label or source_name(source)
    count = 0
    first_at: dict[str, tuple[str, str]] = {}  # id -> (where, content digest)
    for where, record in _records(source):
        if source.max_samples is not None and count >= source.max_samples:
            return
        conv = to_conversation(_mapped(record, source.fields, where), source.format, source.fields, where, label)
        content = content_digest(conv.messages)
        if conv.id in first_at:
            first, same = first_at[conv.id][0], first_at[conv.id][1] == content
            if not same and not conv.meta.get("id_from_content"):
                raise UsageError(
                    f"{where}: id {conv.id.split('#', 1)[1]!r} repeats the record at {first} with other "
                    "messages; ids must be unique within a source (a repeated id would drop a "
                    "conversation)",
                    "fix the ids, or map another field with fields: {id: <field>}",
                )
            repeat = 2  # the same conversation again: numbered, for dedup to count and drop
            while f"{conv.id}~{repeat}" in first_at:
                repeat += 1
            conv.id = f"{conv.id}~{repeat}"
        first_at[conv.id] = (where, content)
        conv.meta.pop("id_from_content", None)
        yield conv
        count += 1
    if count == 0:
        raise UsageError(f"prompt source {source.path} is empty", "point datagen.sources at a file with records")


OPTIONAL_FIELDS = ("response", "system")  # mapped columns a record may lack (a prompt without an answer)


def _mapped(record: Any, fields: dict[str, str], where: str) -> Any:
    """`record` with its field mapping's extras applied: `input` (Alpaca's) appended to the prompt after a blank
    line when it holds text, `category` copied from its column. A mapped column the record lacks (but
    `response`, `system`) is one line naming it and the columns the record has."""
    if not fields or not isinstance(record, dict):
        return record
    for name, column in fields.items():
        if name not in OPTIONAL_FIELDS and column not in record:
            columns = sorted(map(str, record))
            shown = ", ".join(columns[:12]) + (f" (+{len(columns) - 12} more)" if len(columns) > 12 else "")
            raise UsageError(
                f"{where}: no column {column!r} (fields.{name}); the record's columns: {shown}",
                f"map {name} to one of them: fields: {{{name}: <column>}}",
            )
    if "input" not in fields and "category" not in fields:
        return record
    record = dict(record)
    extra, prompt = record.get(fields.get("input", "")), fields.get("prompt", "prompt")
    if isinstance(extra, str) and extra.strip() and isinstance(record.get(prompt), str):
        record[prompt] = f"{record[prompt]}\n\n{extra}"
    if "category" in fields:
        record["category"] = record[fields["category"]]
    return record


def local_source_problem(path: str) -> str | None:
    """Why a source or evaluation set that names a local file cannot be read (None: fine, or a hub dataset).

    What `read_source` would refuse first, asked without reading it (the preflight)."""
    if _bundled(path) is not None or not _looks_local(path):
        return None
    file = Path(path).expanduser()
    if not file.is_file():
        return f"{path} not found; check the path (a local .jsonl, .json or .parquet file)"
    if file.suffix.lower() not in LOCAL_SUFFIXES:
        return f"{path}: unsupported file type {file.suffix or '(none)'}; use .jsonl, .json or .parquet"
    return None


def _looks_local(path: str) -> bool:
    return path.endswith(LOCAL_SUFFIXES) or path.startswith(("/", "./", "../", "~")) or Path(path).exists()


def _bundled(path: str) -> Path | None:
    from dspark_cli.prompts.bundled import bundled_dataset

    return bundled_dataset(path)


def _records(source: PromptSource) -> Iterator[tuple[str, Any]]:
    bundled = _bundled(source.path)
    path = bundled if bundled is not None else Path(source.path).expanduser()
    if bundled is not None or _looks_local(source.path):
        if not path.is_file():
            raise UsageError(f"prompt source not found: {source.path}", "check the path in datagen.sources")
        yield from _file_records(path)
        return
    yield from _hub_records(source)


def _file_records(path: Path) -> Iterator[tuple[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        yield from _jsonl_records(path)
    elif suffix == ".json":
        try:
            data = parse_json(path.read_text(encoding="utf-8"), str(path))
        except UnicodeDecodeError as exc:
            raise _not_text(path, exc) from None
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})", _JSON_HINT) from None
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise UsageError(f'{path.name}: a JSON source is a list of records (or {{"data": [...]}})')
        for index, record in enumerate(data):
            yield f"{path.name}[{index}]", record
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(
                f"{path}: not a readable Parquet file ({first[:160]})", "check the file, or convert it to JSONL"
            ) from None
        for index, record in enumerate(table.to_pylist()):
            yield f"{path.name}[{index}]", record
    else:
        raise UsageError(f"{path.name}: unsupported file type {suffix or '(none)'}; use .jsonl, .json or .parquet")


def _jsonl_records(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _not_text(path, exc, number) from None
            if not line.strip():
                continue
            try:
                yield f"{path.name}:{number}", parse_json(line, f"{path}:{number}")
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{number}: invalid JSON ({exc.msg})", _JSON_HINT) from None


def _not_text(path: Path, exc: UnicodeDecodeError, line: int | None = None) -> UsageError:
    where = f"{path}:{line}" if line is not None else str(path)
    return UsageError(
        f"{where}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); is it a binary file?",
        "datagen.sources takes JSONL or JSON text (UTF-8) or Parquet files",
    )


def _hub_records(source: PromptSource) -> Iterator[tuple[str, Any]]:
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a core dependency
        raise UsageError("reading Hugging Face datasets needs the `datasets` package", "pip install datasets") from None
    try:
        dataset = datasets.load_dataset(source.path, name=source.subset, split=source.split, streaming=True)
    except Exception as exc:  # noqa: BLE001 - datasets raises many types; all mean "cannot read it"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"cannot load dataset {source.path} (split {source.split}): {first[:200]}",
            "check the name, split and network, or download it and point datagen.sources at the file",
        ) from None
    for index, record in enumerate(dataset):
        yield f"{source.path}[{index}]", record
