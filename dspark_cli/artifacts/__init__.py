"""Artifacts: the directories one stage writes and the next reads, written and read back in one place.

    from dspark_cli.artifacts.files import claim_output_dir, write_json_atomic, read_manifest
    from dspark_cli.artifacts.datagen import iter_records           # datagen output -> capture
    from dspark_cli.artifacts.draft import load_draft_dir, read_draft_manifest   # train/export -> everyone

- files.py    manifests (`manifest.json`), sha256 checksums, atomic JSON, claiming an output directory,
              temp dirs renamed into place, stale temp dirs cleaned up
- jsonl.py    sharded JSONL that survives being killed (datagen's shards)
- datagen.py  a finished datagen output: its manifest and its records, checksums verified
- draft.py    a trained or exported draft: config + weights (`load_draft_dir`), its `dspark_manifest.json`

Every reader is strict: a missing or broken file is one line (`DataError` / `UsageError`) naming it and
saying which stage to re-run. Capture shards, training checkpoints and bench reports keep their
formats next to their stages (`capture/shards.py`, `training/checkpoint.py`, `bench/report.py`),
built on files.py. Import-light: torch and safetensors load inside the functions that need them.
"""
