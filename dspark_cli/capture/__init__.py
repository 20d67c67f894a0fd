"""Hidden-state capture: the target's layer outputs and post-norm last state, per datagen sample.

    from dspark_cli.capture import plan_capture, run_capture, iter_captured
    plan_capture(recipe)                                  # sizes, no model load (`dspark train --dry-run`)
    run_capture(recipe)                                   # offline shards + manifest, resumable
    ensure_capture(recipe)                                # the same, only when training would need it
    for seq in iter_captured(recipe.stage_dir("capture"), expect=contract_for_recipe(recipe)): ...

    supervise(recipe_file, recipe, overrides=[])          # online producers (`dspark produce`)

Modules: `plan.py` (geometry, layer ids, contract, shard plan; no torch), `hf.py` (transformers hooks),
`vllm.py` (the vLLM engine: arguments, drain, post-processing; `vllm_connector.py` its CPU connector), `shards.py` (safetensors format, tensor decoding),
`store.py` (the online stream's key/bytes store: files by default; `mooncake_store.py` the Mooncake
one), `stream.py` (P producers -> N readers over a store, bounded), `devices.py` (producer / trainer
device split), `run.py` (orchestration), `online.py` (producers and their supervisor), `types.py`
(`CapturedSequence`). The output directory and its manifest are read by `dspark_cli.artifacts.capture`.
Importing this package does not import torch.
"""

from __future__ import annotations

from dspark_cli.lazy import lazy_exports

_EXPORTS = {
    "plan_capture": "dspark_cli.capture.plan",
    "contract_for_recipe": "dspark_cli.capture.plan",
    "build_plan": "dspark_cli.capture.plan",
    "resolve_layer_ids": "dspark_cli.capture.plan",
    "run_capture": "dspark_cli.capture.run",
    "capture_pending": "dspark_cli.capture.run",
    "ensure_capture": "dspark_cli.capture.run",
    "iter_captured": "dspark_cli.capture.shards",
    "verify_captured": "dspark_cli.artifacts.capture",  # the capture directory's reader, no tensors
    "produce_stream": "dspark_cli.capture.online",
    "Supervisor": "dspark_cli.capture.online",
    "supervise": "dspark_cli.capture.online",
    "stream_location": "dspark_cli.capture.online",
    "open_store": "dspark_cli.capture.store",
    "StreamReader": "dspark_cli.capture.stream",
    "StreamProducer": "dspark_cli.capture.stream",
    "device_split_problems": "dspark_cli.capture.devices",
    "apply_default_split": "dspark_cli.capture.devices",
    "visible_gpus": "dspark_cli.capture.devices",
    "producer_environ": "dspark_cli.capture.devices",
    "narrow_train_devices": "dspark_cli.capture.devices",
    "CapturedSequence": "dspark_cli.capture.types",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
