"""Who owns an online stream: the train run that reads it, marked in the stream itself.

    with claim_stream(location, train_dir) as store:   # rank 0 of `dspark train`, for the whole run
        ...
    claim_problem(location, train_dir)                 # (message, hint) or None, touching nothing (preflight)
    adopt_stream(location)                             # `dspark produce`: refuse a folder dspark did not make

The mark is `.dspark-owner` in the stream, `{"kind": "dspark.stream", "train_dir": ...}`: a file in a
stream directory, a key of that name in a Mooncake namespace. A stream belongs to the train run (its
output directory, `train.output_dir`) that trains from it. Another train directory is refused while that
run has not finished (consumer.json `finished`): two runs would release and rewind each other's shards.
Once it finished, the next train run takes the stream over (the stream rewinds to its first shard). In a
directory, rank 0 also holds `.dspark-lock` for the run (artifacts/files.py `exclusive_output`, kind
`dspark.stream`); Mooncake has no lock, so there only the mark tells two trainers apart.

A directory dspark did not make (files of its own, e.g. a user's consumer.json) is refused before anything
is written there. A stream made by a dspark that left no mark (its producers' statuses are dspark's) is
adopted: the mark is added.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dspark_cli.artifacts.files import LOCKS, OWNER_NAME, exclusive_output, make_public, ownership_problem
from dspark_cli.capture.store import Store, open_store
from dspark_cli.capture.stream import CONSUMER_KEY, STREAM_KIND, read_json, write_json
from dspark_cli.errors import UsageError

OWNER_KIND = "dspark.stream"
OWNER_KEY = OWNER_NAME
FIELD = "capture.stream"
NEW_FOLDER = "set capture.stream to a new (or empty) folder, or leave it unset (default: <capture dir>-stream)"

Problem = tuple[str, str]  # (message, hint): a UsageError's


def stream_directory(location: str) -> Path | None:
    """The directory of a filesystem stream (a path or file://path); None for another store."""
    scheme, sep, rest = str(location).partition("://")
    if not sep:
        return Path(location)
    return Path(rest) if scheme == "file" else None


def _read(store: Store, key: str) -> dict[str, Any] | None:
    try:
        data = read_json(store, key)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _made_by_dspark(store: Store) -> bool:
    """A stream without the mark that dspark made all the same: its producers' statuses say so."""
    return any((_read(store, key) or {}).get("kind") == STREAM_KIND for key in store.keys("producers/"))


def _stranger_directory(directory: Path) -> Problem | None:
    """Why `directory` is not a stream dspark may use (None: new, empty, marked, or an unmarked dspark stream)."""
    from dspark_cli.capture.store import FileStore

    problem = ownership_problem(directory, OWNER_KIND, FIELD)
    if problem is None:
        return None
    if directory.is_dir() and not directory.is_symlink():
        if _made_by_dspark(FileStore(directory)):
            return None
        names = sorted(p.name for p in directory.iterdir() if p.name not in LOCKS)
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return (
            f"{FIELD}: {directory} holds {shown}, which dspark did not write; refusing to use it as the stream",
            NEW_FOLDER,
        )
    return problem.split("; ")[0] + "; refusing to use it as the stream", NEW_FOLDER


def _stranger_store(store: Store, location: str) -> Problem | None:
    """The same for a store that is not a directory: unmarked, yet holding a consumer.json dspark did not write."""
    if store.get(OWNER_KEY) is not None or _made_by_dspark(store):
        return None
    if store.get(CONSUMER_KEY) is not None:
        return f"{FIELD}: {location} holds a consumer.json dspark did not write; refusing to use it as the stream", (
            NEW_FOLDER.replace("folder", "namespace")
        )
    return None


def _owner_problem(store: Store, location: str, train_dir: Path) -> Problem | None:
    """Another train run's stream it has not finished reading."""
    owner = _read(store, OWNER_KEY) or {}
    theirs = owner.get("train_dir")
    if not theirs or theirs == str(train_dir) or (_read(store, CONSUMER_KEY) or {}).get("finished"):
        return None
    return (
        f"{FIELD}: {location} is the stream of the train run in {theirs} (not finished)",
        f"set capture.stream to another folder, or train with the same -o {theirs}",
    )


def _own(train_dir: str | os.PathLike[str]) -> Path:
    return Path(train_dir).expanduser().resolve()


def claim_problem(location: str, train_dir: str | os.PathLike[str]) -> Problem | None:
    """Why the train run in `train_dir` may not claim the stream at `location`, touching nothing (None: it may).
    Judges a directory only: another store is judged when the run opens it."""
    directory = stream_directory(location)
    if directory is None:
        return None
    problem = _stranger_directory(directory)
    if problem is not None or not directory.is_dir():
        return problem
    from dspark_cli.capture.store import FileStore

    return _owner_problem(FileStore(directory), location, _own(train_dir))


def _refuse(problem: Problem | None) -> None:
    if problem is not None:
        raise UsageError(*problem)


@contextlib.contextmanager
def claim_stream(location: str, train_dir: str | os.PathLike[str]) -> Iterator[Store]:
    """Claim the stream at `location` for the train run in `train_dir` and hold it (a directory: locked)
    until the block ends; yields the opened store. A UsageError, before anything is written, when it is a
    folder dspark did not make or the stream of another train run that has not finished."""
    train_dir = _own(train_dir)
    directory = stream_directory(location)
    with contextlib.ExitStack() as stack:
        if directory is not None:
            _refuse(claim_problem(location, train_dir))
            if directory.is_dir():
                _mark_if_absent(directory)  # an unmarked dspark stream: adopted, so exclusive_output accepts it
            stack.enter_context(exclusive_output(directory, FIELD, kind=OWNER_KIND))
        store = open_store(location)
        if directory is None:
            _refuse(_stranger_store(store, location))
        _refuse(_owner_problem(store, location, train_dir))  # again under the lock
        write_json(store, OWNER_KEY, {"kind": OWNER_KIND, "train_dir": str(train_dir)})
        yield store


def adopt_stream(location: str) -> None:
    """`dspark produce`: a directory stream must be dspark's (new, empty or a stream); marked if not yet, never
    replacing a trainer's mark. Another store is left to the trainers' claim."""
    directory = stream_directory(location)
    if directory is None:
        return
    _refuse(_stranger_directory(directory))
    directory.mkdir(parents=True, exist_ok=True)
    _mark_if_absent(directory)


def _mark_if_absent(directory: Path) -> None:
    """Write `{"kind": "dspark.stream"}` as the mark unless one is there (a hard link: never a half-written one)."""
    path = directory / OWNER_NAME
    if path.exists():
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{OWNER_NAME}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"kind": OWNER_KIND}, handle)
        make_public(tmp)
        with contextlib.suppress(FileExistsError):  # another process marked it meanwhile: theirs stays
            os.link(tmp, path)
    finally:
        os.unlink(tmp)
