"""Online capture producers: P processes, each with its own engine, publish their shards into the stream.

    dspark produce RECIPE [key=value ...]                  # supervise capture.workers producers (cli/produce.py)
    dspark produce RECIPE --only 2,3 [key=value ...]       # producers 2 and 3 here, the others elsewhere
    python -m dspark_cli.capture.producers RECIPE STREAM --worker=1 [key=value ...] # one producer (what the supervisor runs)

`dspark train` starts the supervisor itself (global rank 0, in a thread) unless
`capture.external_producers`; on inference machines `dspark produce` runs it (`--only`: the
producers this machine runs, the others run elsewhere against the same stream). A producer stays
until the trainers mark the stream finished: a trainer resumed from a checkpoint rewinds the
stream, and the producers capture again what it needs. The supervisor restarts a producer that died (SIGKILL, OOM, ...) up to `MAX_RESTARTS` times;
the restarted producer skips every shard it had published (capture/stream.py). A producer started
by a rank dies with its supervisor (PR_SET_PDEATHSIG), so a trainer restarted by torchrun starts
fresh producers instead of finding two writers per share. Producer w captures the plan's shards
w, w + P, ... on its devices (machine/devices.py). Producer 0 first publishes the datagen validation split
under the stream's `validation/` keys (capture/validation_stream.py), once per plan.

A producer that fails records why in its error file (machine/procs.py `record_failure`), and the supervisor
gives up with that root cause and the producer's log: `capture producer 0 failed: ... (its log: ...)`. A
producer interrupted (SIGINT, as a terminal's Ctrl-C sends its process group, or SIGTERM, as the supervisor
stops it) is no failure: it stops where it is, records nothing in the stream, exits 130, and its supervisor
stops (`interrupted`) instead of restarting it; the next run's producers go on from there. A supervisor that
starts producers clears the errors their predecessors recorded in the stream (they are restarted: a cause
that is still there fails them again), so a fixed problem never fails the next run at once. The
log is `<train dir>/logs/producer-<w>.log` when `dspark train` starts the producers,
`<capture dir>/logs/producer-<w>.log` under `dspark produce`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_cli.artifacts.results import ProduceSummary
from dspark_cli.machine.procs import ERROR_FILE, ChildFailure, read_failure, record_failure

if TYPE_CHECKING:
    from dspark_cli.recipe.schema import Recipe

log = logging.getLogger(__name__)
MAX_RESTARTS = 3  # per producer, per supervisor
INTERRUPTED = 130  # a producer's exit code when SIGINT / SIGTERM stopped it


class _Engine:
    """The producer's capture engine, loaded on first use and kept across the stream's rewinds."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe, self.inner = recipe, None

    def _load(self) -> Any:
        if self.inner is None:
            from dspark_cli.capture.capturer import make_capturer
            from dspark_cli.capture.plan import build_plan

            self.inner = make_capturer(build_plan(self.recipe), Path(self.recipe.stage_dir("capture")))
        return self.inner

    def describe(self) -> dict[str, Any]:
        return self.inner.describe() if self.inner is not None else {"backend": self.recipe.capture.backend}

    def capture(self, samples: list[Any]) -> Any:
        return self._load().capture(samples)

    def close(self) -> None:
        if self.inner is not None and hasattr(self.inner, "close"):
            self.inner.close()


def produce_stream(recipe: Recipe, location: str, worker: int, *, restarts: int = 0) -> dict[str, Any]:
    """Producer `worker` of `capture.workers`: capture its shards into the stream at `location`, then stay
    until the trainers finish: a trainer resumed from a checkpoint rewinds the stream, and the producer
    captures again, with the same engine, the shards of its share the new window lacks."""
    from dspark_cli.capture.run import run_capture
    from dspark_cli.capture.store import open_store
    from dspark_cli.capture.stream import StreamClosed, StreamProducer, StreamRewound

    # keeping shards for later epochs: the trainer checked the whole stream fits capture.keep_max_bytes
    window = 1 << 40 if recipe.capture.keep_max_bytes else recipe.capture.queue_max_shards
    producer = StreamProducer(
        open_store(location), worker=worker, workers=recipe.capture.workers, max_shards=window, restarts=restarts
    )
    # each engine its own scratch (vLLM's hidden-states connector writes under <capture dir>/.vllm)
    scratch = str(Path(recipe.stage_dir("capture")) / f".producer-{worker}")
    recipe = recipe.model_copy(update={"capture": recipe.capture.model_copy(update={"output_dir": scratch})})
    engine, summary, rewinds = _Engine(recipe), {}, 0
    try:
        if worker == 0:  # the validation split first, apart from the training shards (capture/validation_stream.py)
            from dspark_cli.capture.validation_stream import publish_validation

            publish_validation(recipe, producer.store, engine)
        while True:
            try:
                summary = run_capture(recipe, queue=producer, capturer=engine).to_dict()  # its JSON report
                producer.wait_until_closed()
            except StreamRewound as exc:
                rewinds += 1
                log.info("producer %d: %s; capturing what the window lacks again", worker, exc)
                continue
            except StreamClosed as exc:
                summary = {"stream": location, "worker": worker, "closed": str(exc)}
            return {**summary, "rewinds": rewinds, "wait_seconds": round(producer.status.get("wait_s", 0.0), 2)}
    finally:
        engine.close()


class Supervisor:
    """Start `capture.workers` producer processes for the stream and keep them running until each finished.

    `run()` blocks (the `python -m dspark_cli.capture.producers` foreground); `start()` runs it in a thread (the
    trainer's rank 0) and `stop()` ends it and its producers. `error` holds the reason it gave up, `failure`
    the failed producer's own (what it recorded), `failed_log` its log. `log_dir`: each producer's output
    goes to `<log_dir>/producer-<w>.log` (default: this process's output), which `error` names.
    """

    def __init__(
        self,
        recipe_file: str | Path,
        location: str,
        recipe: Recipe,
        *,
        overrides: list[str] | None = None,
        environ: dict[str, str] | None = None,
        poll_s: float = 0.2,
        bind_to_parent: bool = True,
        on_event: Callable[[str], None] | None = None,
        workers: list[int] | None = None,
        log_dir: str | Path | None = None,
        store: Any = None,
    ) -> None:
        self.recipe_file, self.location, self.recipe = str(recipe_file), location, recipe
        self.overrides, self.environ, self.poll_s = list(overrides or []), environ, poll_s
        self.bind_to_parent, self.on_event = bind_to_parent, on_event or log.info
        self.workers = list(range(recipe.capture.workers)) if workers is None else list(workers)
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.store = store  # the stream's store, when the caller has it open (default: opened for a directory)
        self.procs: dict[int, subprocess.Popen] = {}
        self.restarts: dict[int, int] = {}
        self.error: str | None = None
        self.interrupted: str | None = None  # which producer was interrupted: the supervisor stopped
        self.failure: ChildFailure | None = None
        self.failed_log: Path | None = None
        self._errors = Path()  # run(): a private directory of each producer's error file
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def log_path(self, worker: int) -> Path | None:
        return None if self.log_dir is None else self.log_dir / f"producer-{worker}.log"

    def _error_file(self, worker: int) -> Path:
        return self._errors / f"producer-{worker}.json"

    def _spawn(self, worker: int) -> subprocess.Popen:
        from dspark_cli.machine.devices import producer_environ
        from dspark_cli.machine.procs import dies_with_parent

        cmd = [
            sys.executable,
            "-m",
            "dspark_cli.capture.producers",
            self.recipe_file,
            self.location,
            f"--worker={worker}",
            f"--restarts={self.restarts.get(worker, 0)}",
            *self.overrides,
        ]
        env = producer_environ(self.recipe, worker, self.environ if self.environ is not None else os.environ)
        self._error_file(worker).unlink(missing_ok=True)  # a restarted producer's own, not its predecessor's
        env[ERROR_FILE] = str(self._error_file(worker))
        # SIGKILL when the supervising thread goes: a producer's work is resumable
        bind = dies_with_parent(signal.SIGKILL) if self.bind_to_parent else None
        output = self.log_path(worker)
        if output is None:
            return subprocess.Popen(cmd, env=env, preexec_fn=bind)
        output.parent.mkdir(parents=True, exist_ok=True)
        with open(output, "a", encoding="utf-8") as out:  # the child holds its own copy
            return subprocess.Popen(cmd, env=env, preexec_fn=bind, stdout=out, stderr=subprocess.STDOUT)

    def _failed(self, worker: int, code: int) -> str:
        """Why producer `worker` (exit `code`) failed: its own error when it recorded one, and its log."""
        self.failure, self.failed_log = read_failure(self._error_file(worker)), self.log_path(worker)
        why = f": {self.failure.cause}" if self.failure is not None else f" (exit {code})"
        return f"capture producer {worker} failed{why}{self._log_note(worker)}"

    def _log_note(self, worker: int) -> str:
        output = self.log_path(worker)
        return "" if output is None else f" (its log: {output})"

    @property
    def gave_up(self) -> str | None:
        """Why no more shards come from this supervisor's producers (None: they are running)."""
        return self.error or self.interrupted

    def _forget_failures(self) -> None:
        """Clear what earlier producers of the workers it starts recorded as their error: they run again."""
        from dspark_cli.capture.store import open_store
        from dspark_cli.capture.stream import producer_key, read_json, write_json

        store = self.store
        if store is None and "://" in self.location and not self.location.startswith("file://"):
            return  # no client of another store opened just for this: each producer clears its own as it opens
        store = store or open_store(self.location)
        for worker in self.workers:
            status = read_json(store, producer_key(worker))
            if status is not None and status.get("error"):
                log.info("capture producer %d: an earlier run recorded %r; starting it again", worker, status["error"])
                write_json(store, producer_key(worker), {**status, "error": None})

    def run(self) -> None:
        self._errors = Path(tempfile.mkdtemp(prefix="dspark-producers-"))
        try:
            if self._thread is None:  # start() has done it
                self._forget_failures()
            for worker in self.workers:
                self.procs[worker] = self._spawn(worker)
            while not self._stop.is_set() and self.procs:
                for worker, proc in list(self.procs.items()):
                    code = proc.poll()
                    if code is None:
                        continue
                    if code == 0:
                        del self.procs[worker]
                        continue
                    if code == INTERRUPTED:  # asked to stop (Ctrl-C, SIGTERM): so is the run, not restarted
                        self.interrupted = f"capture producer {worker} was interrupted{self._log_note(worker)}"
                        self._stop.set()
                        break
                    if code in (1, 2):  # an error the producer recorded; restarting repeats it
                        self.error = self._failed(worker, code)
                        self._stop.set()
                        break
                    if self.restarts.get(worker, 0) >= MAX_RESTARTS:
                        self.error = (
                            f"capture producer {worker} died {MAX_RESTARTS + 1} times (last exit {code})"
                            + self._log_note(worker)
                        )
                        self.failed_log = self.log_path(worker)
                        self._fail(worker, self.error)
                        self._stop.set()
                        break
                    self.restarts[worker] = self.restarts.get(worker, 0) + 1
                    self.on_event(
                        f"capture producer {worker} exited with {code}: restarting it "
                        f"({self.restarts[worker]} of {MAX_RESTARTS})"
                    )
                    self.procs[worker] = self._spawn(worker)
                self._stop.wait(self.poll_s)
        finally:
            self._terminate()
            shutil.rmtree(self._errors, ignore_errors=True)

    def _fail(self, worker: int, message: str) -> None:
        from dspark_cli.capture.store import open_store
        from dspark_cli.capture.stream import producer_key, read_json, write_json

        store = open_store(self.location)
        status = read_json(store, producer_key(worker))
        if status is not None:
            status["error"] = message
            write_json(store, producer_key(worker), status)

    def _terminate(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def start(self) -> Supervisor:
        self._forget_failures()  # before any trainer reads the stream
        self._thread = threading.Thread(target=self.run, name="capture-producers", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def pids(self) -> dict[int, int]:
        return {worker: proc.pid for worker, proc in self.procs.items()}


def supervise(
    recipe_file: str | Path,
    recipe: Recipe,
    *,
    overrides: list[str],
    only: list[int] | None = None,
    location: str | None = None,
) -> ProduceSummary:
    """Run this machine's producers (all, or `only`) in the foreground until each is done; the summary.
    `location` defaults to the recipe's stream (what the trainers read)."""
    from dspark_cli.errors import DsparkError, UsageError

    if only is not None and not all(0 <= w < recipe.capture.workers for w in only):
        raise UsageError(
            f"--only={','.join(map(str, only))}: producers are 0..{recipe.capture.workers - 1}",
            "name this machine's share of capture.workers",
        )
    location = location or stream_location(recipe)
    from dspark_cli.capture.stream_owner import adopt_stream

    adopt_stream(location)  # a folder dspark did not make is refused before a producer writes there
    logs = Path(recipe.stage_dir("capture")) / "logs"
    supervisor = Supervisor(
        recipe_file, location, recipe, overrides=overrides, workers=only, bind_to_parent=True, log_dir=logs
    )
    started = time.time()
    supervisor.run()
    if supervisor.interrupted and not supervisor.error:
        raise KeyboardInterrupt(supervisor.interrupted)
    if supervisor.error:  # its message names the producer's log
        failure = supervisor.failure
        error = DsparkError(
            supervisor.error,
            failure.hint
            if failure is not None and failure.hint
            else "fix it and run again: the producers resume where they stopped",
        )
        error.exit_code = failure.exit_code if failure is not None else 1
        raise error
    return ProduceSummary(
        stream=location,
        producers=len(supervisor.workers),
        restarts=supervisor.restarts,
        seconds=round(time.time() - started, 1),
    )


def stream_location(recipe: Recipe) -> str:
    """The stream producers and trainers share: `capture.stream`, default `<capture dir>-stream`."""
    return recipe.capture.stream or recipe.stage_dir("capture") + "-stream"


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    from dspark_cli.errors import DsparkError, debug_enabled
    from dspark_cli.recipe import load_recipe

    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[2].strip())
        return 2
    options = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args[2:] if a.startswith("--") and "=" in a}
    overrides = [a for a in args[2:] if not a.startswith("--")]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    worker = options.get("--worker")
    if worker is not None:  # the supervisor's stop (SIGTERM) ends a producer as Ctrl-C does
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        recipe = load_recipe(args[0], overrides)
        if worker is not None:
            summary = produce_stream(recipe, args[1], int(worker), restarts=int(options.get("--restarts", 0)))
        else:
            only = [int(w) for w in options["--only"].split(",")] if "--only" in options else None
            summary = supervise(args[0], recipe, overrides=overrides, only=only, location=args[1]).to_dict()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second signal must not cut the clean exit short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if debug_enabled():
            raise
        print("interrupted; the producers resume where they stopped", file=sys.stderr)
        return INTERRUPTED
    except Exception as exc:
        if worker is not None:  # for the supervisor: the root cause of its giving up
            record_failure(exc, f"capture producer {worker}")
        if not isinstance(exc, DsparkError):
            raise  # its traceback, in the producer's output
        if not sys.stderr.isatty():  # a log (the supervisor's, or the run's): the traceback belongs there
            traceback.print_exc(file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
