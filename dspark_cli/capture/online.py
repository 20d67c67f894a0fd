"""Online capture producer: fills a bounded on-disk queue while the trainer consumes it.

    python -m dspark_cli.capture.online templates/recipes/tiny.yaml runs/tiny/hidden-queue [key=value ...]

or, from Python, in a process of its own (safe under `multiprocessing` spawn: module-level, picklable
arguments):

    ctx = multiprocessing.get_context("spawn")
    ctx.Process(target=produce_online, args=("tiny.yaml", "runs/tiny/hidden-queue", ["capture.batch_size=4"])).start()
    for seq in iter_queue("runs/tiny/hidden-queue", expect=contract_for_recipe(recipe)): ...

The bound is `capture.queue_max_shards`; peak disk lands in `<queue>/queue.json` (`peak_bytes`).
Restarted after a crash, the producer continues after the last shard it published.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def produce_online(recipe: Any, queue_dir: str | os.PathLike[str], overrides: list[str] | None = None) -> dict[str, Any]:
    """Run capture into the queue at `queue_dir`; `recipe` is a Recipe or a recipe path/template name."""
    from dspark_cli.capture.queue import OnlineQueue
    from dspark_cli.capture.run import run_capture
    from dspark_cli.recipe import Recipe, load_recipe

    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe, overrides or [])
    queue = OnlineQueue(queue_dir, recipe.capture.queue_max_shards)
    return run_capture(recipe, queue=queue)


def main(argv: list[str] | None = None) -> int:
    from dspark_cli.errors import DsparkError

    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[2].strip())
        return 2
    try:
        summary = produce_online(args[0], args[1], args[2:])
    except DsparkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
