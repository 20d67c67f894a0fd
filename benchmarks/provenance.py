"""What every benchmark record carries, and the one writer of benchmarks/results/ (stdlib only).

    rec = provenance.Recording("capture", allow_dirty=args.allow_dirty)  # first: refuses dirty sources
    ...                                                                    # measure
    rec.write(result, markdown)   # results/capture.json with a "provenance" object, capture.md from it

    python benchmarks/provenance.py run NAME [--allow-dirty] -- bash SCRIPT ...  # a shell script's record
    python benchmarks/provenance.py check [NAME ...]                           # fresh or stale, one line each
    python benchmarks/provenance.py stamp NAME > FILE   # the commit and dirty sources, for a machine without git

A record's provenance: the commit (`git rev-parse HEAD`) and whether the tracked files of its sources
(benchmarks/records.py) differ from it (`dirty`: the writer refuses to write into results/ then, unless
`--allow-dirty`, which the record keeps), the command line, the host's CPU model and cores, the Python (and
torch, when the script imported it) versions, and the 1-minute load average before, after and sampled every
few seconds during the run. A run is `loaded` when the load others put on the machine (the mean sampled load
minus this run's own CPU use, its children included) exceeded 0.75 per core (1.5 on 2 cores): the .md says
so in its first line. The .md is the script's rendering of the JSON between that line and a provenance line;
what people write about a record goes to results/NAME.notes.md, which no script writes.

Changed is decided by content: a Python file whose module AST (docstrings kept) is the same at the record's
commit and in the working tree has not changed (a reformat or a comment does not invalidate a record); any
other file by its bytes; a file added, deleted or renamed under a source path has changed.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SAMPLE_EVERY_S = 5.0
LOADED_PER_CORE = 0.75  # others' load above this per core marks a record loaded (1.5 on 2 cores)
REQUIRED = ("commit", "command", "cpu_model", "cores", "load")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import records  # noqa: E402  (benchmarks/records.py)


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, check=False)
    except OSError as err:  # no git here (a device machine)
        return subprocess.CompletedProcess(["git", *args], 127, b"", str(err).encode())


def head_commit(root: Path = ROOT) -> str | None:
    """HEAD's commit; where there is no repository (a device machine's copy of the tree), DSPARK_RECORD_COMMIT."""
    done = _git(root, "rev-parse", "HEAD")
    if done.returncode == 0:
        return done.stdout.decode().strip()
    return os.environ.get("DSPARK_RECORD_COMMIT") or None


def _same_content(old: bytes, new: bytes, path: str) -> bool:
    if old == new:
        return True
    if not path.endswith(".py"):
        return False
    try:
        return ast.dump(ast.parse(old)) == ast.dump(ast.parse(new))
    except (SyntaxError, ValueError):
        return False


def changed_paths(root: Path, commit: str, paths: Sequence[str]) -> list[str]:
    """The files under `paths` whose content differs between `commit` and the working tree (see the docstring)."""
    listed = _git(root, "diff", "--no-renames", "--name-only", "-z", commit, "--", *paths)
    if listed.returncode != 0:
        raise RuntimeError(f"git diff {commit[:10]} failed: {listed.stderr.decode().strip()}")
    changed = []
    for path in (p for p in listed.stdout.decode().split("\0") if p):
        shown = _git(root, "show", f"{commit}:{path}")
        file = root / path
        if shown.returncode != 0 or not file.is_file() or not _same_content(shown.stdout, file.read_bytes(), path):
            changed.append(path)
    return changed


def dirty_paths(root: Path, commit: str | None, paths: Sequence[str]) -> list[str]:
    """The sources that differ from `commit` in the working tree; without a repository, DSPARK_RECORD_DIRTY."""
    if commit is None:
        return ["(no commit)"]
    if _git(root, "rev-parse", "--git-dir").returncode != 0:
        return [p for p in os.environ.get("DSPARK_RECORD_DIRTY", "").split(",") if p]
    return changed_paths(root, commit, paths)


def cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next((x.split(":", 1)[1].strip() for x in lines if x.startswith("model name")), platform.machine())


def _own_cpu_s() -> float:
    """CPU seconds of this process's threads and of its children that have been waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class LoadSampler:
    """The 1-minute load average every `every` seconds in a background thread, until `stop()`."""

    def __init__(self, every: float = SAMPLE_EVERY_S) -> None:
        self.every = every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.every):
                return

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join()
        return self.samples + [os.getloadavg()[0]]


def _command_line() -> str:
    python = Path(sys.executable)
    try:
        python = python.relative_to(ROOT)
    except ValueError:
        pass
    return shlex.join([str(python), *sys.argv])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--allow-dirty`, which every recording script takes."""
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="record even though the record's sources differ from HEAD (the record is marked dirty)",
    )


class Recording:
    """One run of a benchmark that writes record `name`: checks its sources, samples the load, writes it."""

    def __init__(
        self,
        name: str,
        *,
        allow_dirty: bool = False,
        out_dir: Path | None = None,
        command: str | None = None,
        root: Path = ROOT,
        every: float = SAMPLE_EVERY_S,
        measures_tree: bool = True,
    ) -> None:
        """`measures_tree=False`: the run measures clean clones of commits (suite_time), never this working tree,
        so its uncommitted changes neither refuse nor mark the record."""
        self.name, self.root, self.allow_dirty, self.measures_tree = name, root, allow_dirty, measures_tree
        self.depends = records.depends(name)
        self.out_dir = Path(out_dir) if out_dir is not None else RESULTS
        self.command = command or _command_line()
        self.commit = head_commit(root)
        self._refuse_dirty(self._dirty(), "")
        self.started = time.time()
        self.load_before = os.getloadavg()[0]
        self._cpu0 = _own_cpu_s()
        self._sampler = LoadSampler(every)
        self._provenance: dict[str, Any] | None = None

    def _dirty(self) -> list[str]:
        return dirty_paths(self.root, self.commit, self.depends) if self.measures_tree else []

    def _into_results(self) -> bool:
        return self.out_dir.resolve() == RESULTS.resolve()

    def _refuse_dirty(self, dirty: list[str], when: str) -> None:
        if dirty and self._into_results() and not self.allow_dirty:
            raise SystemExit(
                f"{self.name}: its sources differ from HEAD{when} ({', '.join(dirty[:5])}"
                f"{', ...' if len(dirty) > 5 else ''}): commit them first, or pass --allow-dirty (marked dirty)"
            )

    def provenance(self, versions: dict[str, str] | None = None) -> dict[str, Any]:
        """The run's provenance, taken once at its end (the load sampler stops); later calls return the same."""
        if self._provenance is not None:
            return self._provenance
        samples = self._sampler.stop()
        wall = time.time() - self.started
        own_cores = min((_own_cpu_s() - self._cpu0) / wall, os.cpu_count() or 1) if wall > 0 else 0.0
        cores = os.cpu_count() or 1
        mean = sum(samples) / len(samples)
        dirty = self._dirty()
        torch = sys.modules.get("torch")
        self._provenance = {
            "commit": self.commit,
            "dirty": bool(dirty),
            "dirty_paths": dirty,
            "command": self.command,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "wall_s": round(wall, 1),
            "cpu_model": cpu_model(),
            "cores": cores,
            "python": platform.python_version(),
            "torch": getattr(torch, "__version__", None),
            **(versions or {}),
            "load": {
                "before": round(self.load_before, 2),
                "after": round(samples[-1], 2),
                "during_mean": round(mean, 2),
                "during_max": round(max(samples), 2),
                "samples": len(samples),
                "every_s": self._sampler.every,
                "own_cores": round(own_cores, 2),
            },
            "loaded": mean - own_cores > LOADED_PER_CORE * cores,
            "depends": list(self.depends),
        }
        return self._provenance

    def write(
        self,
        result: dict[str, Any],
        markdown: Callable[[dict[str, Any]], str] | None = None,
        versions: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """results/NAME.json (`result` with the run's provenance first) and NAME.md (markdown(record) between the
        loaded line and the provenance line). Returns the record written. A record that accumulates rows from
        several runs keeps each row's own provenance (`provenance()`, taken before the row is added)."""
        prov = self.provenance(versions)
        record = {"provenance": prov, **{k: v for k, v in result.items() if k != "provenance"}}
        out = self.out_dir
        if prov["dirty"] and self._into_results() and not self.allow_dirty:  # the sources changed during the run
            out = Path(tempfile.mkdtemp(prefix=f"dspark-record-{self.name}-"))
            print(f"{self.name}: its sources changed during the run; the record went to {out}", file=sys.stderr)
        write_record(out, self.name, record, markdown(record) if markdown is not None else None)
        if out != self.out_dir:
            raise SystemExit(1)
        print(f"wrote {out / self.name}.json" + ("" if markdown is None else " and .md"), file=sys.stderr)
        return record


def loaded_line(prov: dict[str, Any]) -> str:
    load = prov["load"]
    return (
        f"**Loaded machine**: the 1-minute load averaged {load['during_mean']} (max {load['during_max']}) on "
        f"{prov['cores']} cores during this run, {load['own_cores']} of it the run's own: timings are on the low side."
    )


def provenance_line(prov: dict[str, Any]) -> str:
    load = prov["load"]
    state = f"dirty: {', '.join(prov['dirty_paths'])}" if prov["dirty"] else "clean"
    versions = f"Python {prov['python']}" + (f", torch {prov['torch']}" if prov.get("torch") else "")
    return (
        f"Made at commit {str(prov['commit'])[:10]} ({state}) by `{prov['command']}` on {prov['started']}: "
        f"{prov['cpu_model']}, {prov['cores']} cores, {versions}; 1-minute load {load['before']} before, "
        f"{load['during_mean']} mean / {load['during_max']} max during ({load['samples']} samples, "
        f"{load['own_cores']} cores the run's own), {load['after']} after; {prov['wall_s']} s."
    )


def write_record(out_dir: Path, name: str, record: dict[str, Any], body: str | None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    if body is None:
        return
    prov = record["provenance"]
    lines = [loaded_line(prov), ""] if prov["loaded"] else []
    lines += [body.rstrip("\n"), "", provenance_line(prov)]
    if (out_dir / f"{name}.notes.md").is_file():
        lines.append(f"Notes on this record: [{name}.notes.md]({name}.notes.md).")
    (out_dir / f"{name}.md").write_text("\n".join(lines) + "\n")


# --- the staleness check (tests/benchmarks/test_records.py) ---


def _provenances(value: Any, depth: int = 0) -> Iterator[dict[str, Any]]:
    """Every "provenance" object of a record: its own, and those of the rows or sections it accumulates."""
    if depth > 3:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "provenance" and isinstance(item, dict):
                yield item
            else:
                yield from _provenances(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _provenances(item, depth + 1)


def record_problems(root: Path, results: Path, name: str, depends: Sequence[str], command: str = "") -> list[str]:
    """One line per reason record `name` (results/NAME.json) is not a fresh record of its sources at HEAD."""
    rerun = f" (rerun: {command})" if command else ""
    path = results / f"{name}.json"
    if not path.is_file():
        return [f"{name}: no {path.name}{rerun}"]
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        return [f"{name}: {path.name} is not JSON ({err}){rerun}"]
    if not isinstance(data, dict) or not isinstance(data.get("provenance"), dict):
        return [f"{name}: no provenance (commit, command, CPU, load){rerun}"]
    problems: list[str] = []
    for prov in _provenances(data):
        missing = [k for k in REQUIRED if prov.get(k) in (None, "")]
        if missing:
            problems.append(f"{name}: provenance without {', '.join(missing)}{rerun}")
            continue
        commit = str(prov["commit"])
        if _git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            problems.append(f"{name}: made at commit {commit[:10]}, which this repository does not have{rerun}")
            continue
        if _git(root, "merge-base", "--is-ancestor", commit, "HEAD").returncode != 0:
            problems.append(f"{name}: made at commit {commit[:10]}, which is not in HEAD's history{rerun}")
            continue
        if prov.get("dirty"):
            problems.append(f"{name}: made from uncommitted sources ({', '.join(prov.get('dirty_paths', []))}){rerun}")
        changed = changed_paths(root, commit, depends)
        if changed:
            shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
            problems.append(f"{name}: stale, changed since {commit[:10]}: {shown}{rerun}")
    return list(dict.fromkeys(problems))


def unlisted_files(results: Path, table: dict[str, records.Record]) -> list[str]:
    """Files in results/ that are neither a listed record's nor a .notes.md."""
    allowed = {f"{name}{suffix}" for name, entry in table.items() for suffix in (".json", ".md", *entry.extra)}
    return sorted(
        f"results/{p.name}: not a record in benchmarks/records.py, nor a .notes.md"
        for p in results.iterdir()
        if p.is_file() and p.name not in allowed and not p.name.endswith(".notes.md")
    )


def check(names: Sequence[str] = ()) -> list[str]:
    table = records.RECORDS
    lines = [] if names else unlisted_files(RESULTS, table)  # every record, and nothing else, in results/
    for name in names or sorted(table):
        entry = records.record(name)
        if entry.device and not (RESULTS / f"{name}.json").is_file():
            continue
        lines += record_problems(ROOT, RESULTS, name, records.depends(name), entry.command)
    return lines


def _run(args: argparse.Namespace) -> int:
    """A shell script's record: CMD writes its result to $RECORD_DATA (JSON) and may render $RECORD_MARKDOWN
    from it; this adds the provenance and writes both to the results."""
    cmd = args.cmd
    if not cmd:
        raise SystemExit("provenance.py run NAME -- CMD ...: no CMD")
    rec = Recording(args.name, allow_dirty=args.allow_dirty, out_dir=args.out_dir, command=shlex.join(cmd))
    with tempfile.TemporaryDirectory(prefix=f"dspark-record-{args.name}-") as tmp:
        data = Path(args.data) if args.data else Path(tmp) / "data.json"
        body = Path(tmp) / "body.md"
        env = {**os.environ, "RECORD_DATA": str(data), "RECORD_MARKDOWN": str(body)}
        code = subprocess.run(cmd, env=env, check=False).returncode
        if not data.is_file():
            print(
                f"{args.name}: {shlex.join(cmd)} exited {code} and wrote no {data}: nothing recorded", file=sys.stderr
            )
            return code or 1
        result = json.loads(data.read_text())
        text = body.read_text() if body.is_file() else None
        rec.write(result, (lambda _record: text) if text is not None else None)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="NAME [options] -- CMD ...: run CMD, which writes $RECORD_DATA, and record it")
    run.add_argument("name")
    add_arguments(run)
    run.add_argument("--out-dir", type=Path, default=None, help="default: benchmarks/results")
    run.add_argument("--data", help="the JSON the command writes (default: $RECORD_DATA, a temporary file)")
    stamp = sub.add_parser("stamp", help="DSPARK_RECORD_COMMIT= and DSPARK_RECORD_DIRTY= lines for a copy without git")
    stamp.add_argument("name")
    checking = sub.add_parser("check", help="fresh or stale, one line per problem")
    checking.add_argument("names", nargs="*")
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv[argv.index("--") + 1 :] if "--" in argv else []  # what follows `--` is the command, untouched
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.cmd = cmd
    if args.what == "run":
        return _run(args)
    if args.what == "stamp":
        commit = head_commit()
        print(f"DSPARK_RECORD_COMMIT={commit or ''}")
        print(f"DSPARK_RECORD_DIRTY={','.join(dirty_paths(ROOT, commit, records.depends(args.name)))}")
        return 0
    lines = check(args.names)
    print("\n".join(lines) if lines else "every record is fresh")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
