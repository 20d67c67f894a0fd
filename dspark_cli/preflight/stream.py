"""Online stream rules: the stream's location, whether its store answers, and the bounds one step needs.

    stream_location_problems(recipe)         # shared: a malformed `capture.stream` (every command)
    stream_store_answers(recipe, context)    # machine: the Mooncake master answers within PROBE_S (train)
    stream_bounds_hold(recipe, context)      # queue_max_shards / keep_max_bytes against the plan (train)
    stream_is_ours(recipe, context)          # disk: the stream folder is dspark's and this train run's (train)

All four judge online recipes only (`capture.mode: online`); offline, the stream is not used. The
location is parsed by `capture.mooncake_location` and the bounds computed by `training.stream_plan`,
the code a training rank runs, so what a rank would refuse `dspark validate` refuses first.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from dspark_cli.errors import DsparkError

if TYPE_CHECKING:
    from dspark_cli.preflight import Context
    from dspark_cli.recipe.schema import Recipe

PROBE_S = 2.0  # the preflight's wait for a Mooncake master (the location's ?timeout= when shorter)
STORE_SCHEMES = ("file", "mooncake")  # capture/store.py's open_store: a path, file://, or a backend


def _online(recipe: Recipe) -> bool:
    return recipe.capture.mode == "online"


def stream_location_problems(recipe: Recipe) -> list[str]:
    """`capture.stream` is a directory, `file://DIR` or a well-formed `mooncake://` location: the scheme, the
    host, the port, the namespace and every option, named when wrong."""
    location = recipe.capture.stream
    if not _online(recipe) or not location:
        return []
    scheme, sep, _ = location.partition("://")
    if not sep or scheme == "file":
        return []
    if scheme != "mooncake":
        known = scheme.lower() in STORE_SCHEMES
        what = (
            f"the scheme {scheme}:// must be written {scheme.lower()}://"
            if known
            else f"no store backend for {scheme}://"
        )
        return [
            f"capture.stream: {location}: {what}; write a directory on a filesystem every machine mounts, "
            "or mooncake://MASTER_HOST:50051/NAMESPACE (docs/online-transport.md)"
        ]
    from dspark_cli.capture import parse_location

    try:
        parse_location(location)
    except DsparkError as exc:
        return [f"capture.stream: {exc.message.removeprefix('stream ')}; {exc.hint}"]
    return []


def stream_store_answers(recipe: Recipe, context: Context) -> list[str]:
    """A `mooncake://` stream's master answers on both ports within PROBE_S: nothing listening, a host that
    does not resolve, or a master that accepts and never answers is refused here, not in a training rank."""
    location = recipe.capture.stream
    if not _online(recipe) or not location or not location.startswith("mooncake://"):
        return []
    from dspark_cli.capture import parse_location, probe_master

    try:
        where = parse_location(location)
    except DsparkError:
        return []  # a shared rule's problem (stream_location_problems)
    problem = probe_master(where, min(PROBE_S, where.timeout_s))
    return [] if problem is None else [f"capture.stream: {location}: {problem[0]}; {problem[1]}"]


def stream_bounds_hold(recipe: Recipe, context: Context) -> list[str]:
    """The stream's bound holds what one step reads (`capture.queue_max_shards`) or, with shards kept for
    later epochs, the whole stream (`capture.keep_max_bytes`): computed from the step plan once the datagen
    output is finished (as every rank computes it), else only what no data can change."""
    if not _online(recipe):
        return []
    from dspark_cli.artifacts.datagen import datagen_manifest

    try:
        if datagen_manifest(recipe) is None:
            return _keep_below_one_sequence(recipe)
        from dspark_cli.capture import build_plan
        from dspark_cli.training import bound_problem, plan_for_recipe

        world = recipe.train.nproc_per_node * recipe.train.nnodes
        with quiet("dspark_cli.capture.plan"):  # its warnings are the stage's to print, when it runs
            capture_plan = build_plan(recipe)
        plan = plan_for_recipe(recipe, capture_plan, world_size=world, split=False)
        problem = bound_problem(recipe, capture_plan, plan, world_size=world)
    except DsparkError:
        return []  # the data or the target is another rule's problem, or the stage's own
    return [] if problem is None else [f"{problem[0]}; {problem[1]}"]


def stream_is_ours(recipe: Recipe, context: Context) -> list[str]:
    """A directory stream is a folder dspark made (not a user's, e.g. with its own consumer.json) and not the
    stream of another train run (another train.output_dir) that has not finished: what rank 0's claim refuses
    (capture/stream_owner.py), judged without touching the folder. Its lock is taken only by the run; a
    Mooncake stream is judged when the run opens it."""
    if not _online(recipe):
        return []
    from dspark_cli.capture import claim_problem, stream_location

    problem = claim_problem(stream_location(recipe), recipe.stage_dir("train"))
    return [] if problem is None else [f"{problem[0]}; {problem[1]}"]


@contextlib.contextmanager
def quiet(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _keep_below_one_sequence(recipe: Recipe) -> list[str]:
    """Before datagen: `capture.keep_max_bytes` below the bytes of the smallest trainable sequence (two
    loss tokens) can hold no stream at all."""
    keep = recipe.capture.keep_max_bytes
    if keep is None:
        return []
    from dspark_cli.capture import resolve_layer_ids, shard_tensor_bytes
    from dspark_cli.targets import Target

    geometry = Target.of(recipe).geometry(strict=False)
    if geometry.hidden_size is None or geometry.num_hidden_layers is None:
        return []
    layers = len(resolve_layer_ids(recipe, geometry.num_hidden_layers))
    least = shard_tensor_bytes(2, 2, 1, layers, geometry.hidden_size)
    if keep >= least:
        return []
    return [
        f"capture.keep_max_bytes={keep:,} cannot hold one captured sequence ({least:,} bytes for the shortest "
        f"trainable one: {layers} layers of {geometry.hidden_size}); set it to at least the whole stream's "
        "bytes (`dspark train --dry-run` prints them once datagen is done), or unset it to read the data once"
    ]
