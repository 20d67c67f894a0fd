"""The validation split's captured sequences: what training measures acceptance on, never trains on.

    sequences = validation_sequences(recipe, contract)                        # offline: <capture dir>/validation/
    sequences = validation_sequences(recipe, contract, online_reader=source.reader)   # online, in a train run
    sequences = validation_sequences(recipe, contract)                        # online, opening the stream itself

`datagen.validation_fraction` holds conversations out (datagen/filters.py `split_validation`: by the hash
of their normalised prompts); datagen writes them to `<datagen dir>/validation/`, and capture captures
them apart:
- offline (`capture.mode: offline`): into `<capture dir>/validation/`, shards and manifest as the
  training capture's (capture/run.py), read here with `iter_captured`, the contract checked;
- online (`capture.mode: online`): producer 0 publishes them into the stream under `validation/` keys
  that are never released or rewound (capture/validation_stream.py). `online_reader` is the rank's
  `capture.StreamReader` (`OnlineSource.reader` in training/stream_source.py), so the wait for them
  stops when the producers' supervisor gives up or `capture.stream_timeout` runs out; without it the
  stream `capture.stream` (default `<capture dir>-stream`) is opened here. Any rank may read them, any
  number of times.

An empty list when there is no split (`validation_fraction: 0`, fewer than 20 conversations, or a datagen
output made without one): training then runs without validation.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from dspark_cli.errors import DataError

if TYPE_CHECKING:
    from dspark_cli.capture import CapturedSequence
    from dspark_cli.contract import Contract
    from dspark_cli.recipe.schema import Recipe


def validation_sequences(recipe: Recipe, contract: Contract, *, online_reader: Any = None) -> list[CapturedSequence]:
    """The captured validation sequences in plan order ([] when there is no split); one-line DataError
    when the split exists but its capture is missing, unfinished, damaged or of another contract."""
    expect = dataclasses.replace(contract, mask_token_id=None, block_size=None)  # what capture records
    if recipe.capture.mode == "online":
        return _online(recipe, expect, online_reader)
    return _offline(recipe, expect)


def _offline(recipe: Recipe, expect: Contract) -> list[CapturedSequence]:
    from dspark_cli.artifacts.datagen import datagen_manifest, validation_ids
    from dspark_cli.artifacts.files import MANIFEST_NAME
    from dspark_cli.capture import iter_captured, validation_dir

    directory = validation_dir(recipe)
    if not (directory / MANIFEST_NAME).is_file():
        if validation_ids(datagen_manifest(recipe) or {}):
            raise DataError(
                f"{directory}: the datagen validation split was not captured",
                "run `dspark train RECIPE`: it captures what is missing before training",
            )
        return []
    return list(iter_captured(directory, expect=expect))


def _online(recipe: Recipe, expect: Contract, reader: Any) -> list[CapturedSequence]:
    from dspark_cli.capture import StreamReader, build_plan, open_store, read_validation, stream_location
    from dspark_cli.capture import validation_plan as plan_of

    plan = plan_of(recipe)
    if plan is None:
        return []
    if reader is None:
        reader = StreamReader(
            open_store(stream_location(recipe)),
            fingerprint=build_plan(recipe).fingerprint,
            workers=recipe.capture.workers,
            expect=expect,
            timeout_s=recipe.capture.stream_timeout,
        )
    return read_validation(reader, plan)
