"""Artifacts: the directories one stage writes and the next reads, written and read back in one place.

    from dspark_cli.artifacts.files import claim_output_dir, write_json_atomic, read_manifest
    from dspark_cli.artifacts.datagen import iter_records           # datagen output -> capture
    from dspark_cli.artifacts.capture import read_capture            # capture output -> training
    from dspark_cli.artifacts.train import read_train_manifest       # training output -> export
    from dspark_cli.artifacts.draft import load_draft_dir, read_draft_manifest   # train/export -> everyone
    from dspark_cli.artifacts.bench import read_bench_report         # bench report -> publish, bench baselines

- files.py    manifests (`manifest.json`), sha256 checksums, atomic JSON, claiming an output directory,
              temp dirs renamed into place, stale temp dirs cleaned up
- jsonl.py    sharded JSONL that survives being killed (datagen's shards)
- datagen.py  a finished datagen output: its manifest and its records, checksums verified
- capture.py  a capture output: its manifest (finished, of this contract) and its shard files' sizes and
              checksums; the shard tensors are decoded by `capture/shards.py` (torch)
- train.py    a training output: its manifest, its checkpoints (`latest`, meta.json, checksums.json);
              the DCP files are loaded by `training/` (torch)
- draft.py    a trained or exported draft: config + weights (`load_draft_dir`), its `dspark_manifest.json`,
              the recipe it carries (`recipe_of_dir`)
- bench.py    a bench report (`bench.json`)
- bench_output.py  a bench report folder: what bench may write (`output_problem`), its owner mark
- results.py  what each stage returns (`DatagenSummary`, `CaptureSummary`, `TrainSummary`, ...): dataclasses
              the commands read by field, written into manifests and `--format json` by `to_dict()`

Every reader is strict: a missing, unfinished, corrupt or foreign file is one line (`DataError` /
`UsageError`) naming it and saying which stage to re-run. Writers that need torch (capture shards,
checkpoints, the final draft) stay in their stages, built on files.py. Import-light: torch and
safetensors load inside the functions that need them.
"""
