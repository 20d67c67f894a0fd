"""Hidden-state capture: the target's layer outputs and post-norm last state, per datagen sample.

    from dspark_cli.capture import plan_capture, run_capture, iter_captured
    plan_capture(recipe)                                  # sizes, no model load (`dspark train --dry-run`)
    run_capture(recipe)                                   # offline shards + manifest, resumable
    ensure_capture(recipe)                                # the same, only when training would need it
    for seq in iter_captured(recipe.stage_dir("capture"), expect=contract_for_recipe(recipe)): ...
    validation_plan(recipe); validation_dir(recipe)         # the datagen validation split, captured apart

    supervise(recipe_file, recipe, overrides=[])          # online producers (`dspark produce`)

Modules: `plan.py` (geometry, layer ids, contract, shard plan; no torch), `capturer.py` (the backend a
recipe asks for, one shard captured in batches), `hf.py` (transformers hooks),
`vllm.py` (the vLLM engine: arguments, drain, post-processing; `vllm_connector.py` its CPU connector), `shards.py` (safetensors format, tensor decoding),
`store.py` (the online stream's key/bytes store: files by default; `mooncake_store.py` the Mooncake
one, `mooncake_location.py` its URL and master probe), `stream.py` (P producers -> N readers over a store, bounded), `stream_owner.py` (the train run that owns a
stream: its mark and lock), `gate.py` (one launcher of a multi-machine
run captures, the others wait), `run.py` (orchestration), `sinks.py` (where shards go: the output directory and its
manifest, or a stream producer), `producers.py` (producers and their supervisor), `validation_stream.py` (the
validation split in the stream: producer 0 publishes it, any rank reads it), `types.py` (`CapturedSequence`).
The output directory and its manifest are read by `dspark_cli.artifacts.capture`.
Importing this package does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_cli.lazy import lazy_exports

_EXPORTS = {
    "plan_capture": "dspark_cli.capture.plan",
    "contract_for_recipe": "dspark_cli.capture.plan",
    "build_plan": "dspark_cli.capture.plan",
    "workers_beyond_shards": "dspark_cli.capture.plan",
    "resolve_layer_ids": "dspark_cli.capture.plan",
    "shard_tensor_bytes": "dspark_cli.capture.plan",
    "validation_plan": "dspark_cli.capture.plan",
    "validation_dir": "dspark_cli.capture.plan",
    "read_validation": "dspark_cli.capture.validation_stream",
    "run_capture": "dspark_cli.capture.run",
    "capture_pending": "dspark_cli.capture.run",
    "ensure_capture": "dspark_cli.capture.run",
    "iter_captured": "dspark_cli.capture.shards",
    "captured_lengths": "dspark_cli.capture.shards",
    "verify_captured": "dspark_cli.artifacts.capture",  # the capture directory's reader, no tensors
    "produce_stream": "dspark_cli.capture.producers",
    "Supervisor": "dspark_cli.capture.producers",
    "supervise": "dspark_cli.capture.producers",
    "stream_location": "dspark_cli.capture.producers",
    "open_store": "dspark_cli.capture.store",
    "parse_location": "dspark_cli.capture.mooncake_location",
    "probe_master": "dspark_cli.capture.mooncake_location",
    "StreamReader": "dspark_cli.capture.stream",
    "StreamProducer": "dspark_cli.capture.stream",
    "claim_stream": "dspark_cli.capture.stream_owner",
    "claim_problem": "dspark_cli.capture.stream_owner",
    "CapturedSequence": "dspark_cli.capture.types",
    "capture_once": "dspark_cli.capture.gate",
}

if TYPE_CHECKING:  # what editors and type checkers follow; at run time lazy_exports imports on first use
    from dspark_cli.artifacts.capture import verify_captured
    from dspark_cli.capture.gate import capture_once
    from dspark_cli.capture.mooncake_location import parse_location, probe_master
    from dspark_cli.capture.plan import (
        build_plan,
        contract_for_recipe,
        plan_capture,
        resolve_layer_ids,
        shard_tensor_bytes,
        validation_dir,
        validation_plan,
        workers_beyond_shards,
    )
    from dspark_cli.capture.producers import Supervisor, produce_stream, stream_location, supervise
    from dspark_cli.capture.run import capture_pending, ensure_capture, run_capture
    from dspark_cli.capture.shards import captured_lengths, iter_captured
    from dspark_cli.capture.store import open_store
    from dspark_cli.capture.stream import StreamProducer, StreamReader
    from dspark_cli.capture.stream_owner import claim_problem, claim_stream
    from dspark_cli.capture.types import CapturedSequence
    from dspark_cli.capture.validation_stream import read_validation

__all__ = sorted(_EXPORTS)

if not TYPE_CHECKING:  # hidden from type checkers, which would read any name missing above as Any
    __getattr__ = lazy_exports(__name__, _EXPORTS)
