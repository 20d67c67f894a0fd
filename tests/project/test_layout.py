"""The package layout as a rule: which top-level parts of dspark_cli/ may import which (docs/architecture.md).

Every import in every file under dspark_cli/ (module level, inside functions and under TYPE_CHECKING)
is read with `ast`; an edge not in ALLOWED fails, and so does a stage reaching into another stage's
modules instead of the names its package exports (`from dspark_cli.export import verify_draft`, not
`from dspark_cli.export.integrity import ...`). The command layer (cli, pipeline) wires the stages
together and may import their modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "dspark_cli"

# The stages, in data-flow order: each one's package __init__ is its public face to the others.
STAGES = {"datagen", "capture", "training", "export", "bench", "serving", "publish"}
COMMANDS = {"cli", "pipeline"}  # wiring: may import any module of any stage

# Who may import whom, written once. Shared libraries first, then the stages, then the commands.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "lazy": set(),  # package faces that import their modules on first use
    "contract": {"errors"},
    "hubrules": set(),
    "network": {"errors"},  # timeouts, deadlines and response bounds of every HTTP exchange
    # parses only (its rules are preflight's); the bottom library: every part reads recipes, it reads none of them
    "recipe": {"errors"},
    "rehearsal": {"recipe", "targets"},  # a recipe at tiny scale: the tiny target's family and depth
    "targets": {"errors", "contract", "recipe"},
    "artifacts": {"errors", "contract", "draft", "recipe"},
    "prompts": {"errors", "recipe"},
    "kernels": set(),
    "machine": {"errors", "recipe"},  # devices, CPU settings, children that die with their parent or fail
    "draft": {"errors", "contract", "kernels"},
    "ui": {"errors", "hubrules"},
    "datagen": {"errors", "lazy", "recipe", "targets", "artifacts", "prompts", "machine", "network"},
    "capture": {"errors", "lazy", "contract", "recipe", "targets", "artifacts", "machine", "network"},
    "training": {
        "errors",
        "lazy",
        "contract",
        "recipe",
        "targets",
        "artifacts",
        "draft",
        "kernels",
        "capture",
        "machine",
    },
    "export": {"errors", "lazy", "contract", "recipe", "targets", "artifacts", "draft"},
    "bench": {"errors", "recipe", "targets", "artifacts", "prompts", "draft", "export", "network"},
    "serving": {"errors", "lazy", "recipe", "targets", "artifacts", "export", "machine", "network"},
    "publish": {"errors", "lazy", "hubrules", "recipe", "artifacts", "export", "serving", "network"},
    # the one preflight of every stage: recipe rules, this machine, output paths (what serve / publish refuse)
    "preflight": {
        "errors",
        "lazy",
        "hubrules",
        "recipe",
        "targets",
        "artifacts",
        "prompts",
        "machine",
        "datagen",
        "capture",
        "training",  # the online stream's step plan, to check its bounds (training/stream_plan.py, no torch)
        "export",
        "serving",
        "publish",
        "draft",
    },
    "pipeline": {"errors", "recipe", "artifacts", "datagen", "capture", "training", "export", "bench", "publish"},
    "cli": {
        "errors",
        "recipe",
        "targets",
        "ui",
        "pipeline",
        "datagen",
        "capture",
        "training",
        "export",
        "bench",
        "serving",
        "publish",
        "artifacts",
        "prompts",
        "draft",
        "kernels",
        "contract",
        "preflight",
        "rehearsal",
    },
}


def _part(path: Path, root: Path) -> str:
    """The top-level part a file belongs to: `bench` for bench/run.py, `cli` for cli.py or cli/x.py."""
    return path.relative_to(root).parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, imported names) of every absolute dspark_cli import in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import; dspark_cli imports are absolute"
            found.append((node.lineno, node.module or "", [alias.name for alias in node.names]))
    return [(line, module, names) for line, module, names in found if module.split(".")[0] == "dspark_cli"]


def forbidden_edges(root: Path) -> list[str]:
    """One line per import under `root` (a dspark_cli tree) that the layout does not allow."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        if path.parent == root and path.name in ("__init__.py", "__main__.py"):
            continue
        source = _part(path, root)
        where = f"{path.relative_to(root.parent)}"
        if source not in ALLOWED:
            problems.append(f"{where}: {source!r} is a new top-level part; add it to ALLOWED (and architecture.md)")
            continue
        for line, module, names in _imports(path):
            parts = module.split(".")
            targets = [(parts[1], parts[2:])] if len(parts) > 1 else [(name, []) for name in names]
            for target, inner in targets:
                if (
                    target == source
                    or target.startswith("__")
                    or not (root / target).exists()
                    and not (root / f"{target}.py").exists()
                ):
                    continue
                if target not in ALLOWED[source]:
                    problems.append(f"{where}:{line}: {source} imports {module} ({source} -> {target} not allowed)")
                elif target in STAGES and source not in COMMANDS:
                    submodules = [n for n in names if (root / target / f"{n}.py").exists()] if not inner else inner
                    if inner or submodules:
                        problems.append(
                            f"{where}:{line}: {source} imports {target}'s internals ({module}"
                            f"{' ' + ', '.join(submodules) if not inner else ''}); import the name "
                            f"from dspark_cli.{target} (its __init__ exports)"
                        )
    return problems


def test_the_package_follows_the_layout():
    assert forbidden_edges(PACKAGE) == []


def test_every_allowed_part_exists():
    parts = {_part(p, PACKAGE) for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    parts -= {"__init__", "__main__"}
    assert parts == set(ALLOWED), parts ^ set(ALLOWED)


def test_a_forbidden_edge_and_a_reach_into_internals_are_reported(tmp_path):
    """The checker itself: a library importing a stage, and a stage importing another stage's module."""
    root = tmp_path / "dspark_cli"
    for package in ("targets", "bench", "export", "publish"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "export" / "integrity.py").write_text("")
    (root / "targets" / "x.py").write_text("from dspark_cli.bench import run_bench\n")
    (root / "bench" / "y.py").write_text("def f():\n    from dspark_cli.export.integrity import verify_draft\n")
    (root / "publish" / "z.py").write_text("from dspark_cli.export import integrity\n")
    (root / "bench" / "ok.py").write_text("from dspark_cli.export import verify_draft\nimport dspark_cli.targets\n")
    bench_y, publish_z, targets_x = forbidden_edges(root)  # sorted by file; bench/ok.py is fine
    assert bench_y.startswith("dspark_cli/bench/y.py:2: bench imports export's internals (dspark_cli.export.integrity)")
    assert publish_z.startswith(
        "dspark_cli/publish/z.py:1: publish imports export's internals (dspark_cli.export integrity)"
    )
    assert targets_x.endswith("(targets -> bench not allowed)")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _lazy_exports(path: Path) -> dict[str, str]:
    """A package face's `_EXPORTS` (public name -> module holding it); {} for other modules."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def _type_checking_blocks(tree: ast.AST) -> list[ast.If]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)]


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the dspark_cli modules it imports when it runs (module level or inside functions; not the
    imports under TYPE_CHECKING). A name taken from a lazy package face counts as an import of its module."""
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}
    lazy = {name: _lazy_exports(path) for name, path in modules.items() if path.name == "__init__.py"}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = {id(n) for block in _type_checking_blocks(tree) for stmt in block.body for n in ast.walk(stmt)}
        edges = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names if alias.name in modules}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == root.name:
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in modules:
                        edges.add(f"{node.module}.{alias.name}")
                    elif alias.name in lazy.get(node.module, {}):
                        edges.add(lazy[node.module][alias.name])
                    elif node.module in modules:
                        edges.add(node.module)
        graph[name] = edges - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_import_cycle():
    assert import_cycles(import_graph(PACKAGE)) == []


def test_a_cycle_is_found(tmp_path):
    """The checker itself: a cycle through a function-level import and a lazy face is found, a
    TYPE_CHECKING import is not an edge."""
    root = tmp_path / "dspark_cli"
    (root / "stage").mkdir(parents=True)
    (root / "stage" / "__init__.py").write_text('_EXPORTS = {"run": "dspark_cli.stage.run"}\n')
    (root / "stage" / "run.py").write_text("def run():\n    from dspark_cli.stage.workers import w\n")
    (root / "stage" / "workers.py").write_text("from dspark_cli.stage import run\n")
    (root / "other.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dspark_cli.stage.run import run\n"
    )
    (root / "stage" / "plain.py").write_text("import dspark_cli.other\n")
    assert import_cycles(import_graph(root)) == [["dspark_cli.stage.run", "dspark_cli.stage.workers"]]


def test_each_lazy_face_lists_its_exports_under_type_checking():
    """`_EXPORTS` (what the face serves at run time) and its `if TYPE_CHECKING:` imports (what editors and
    checkers follow) name the same things from the same modules."""
    faces = [p for p in sorted(PACKAGE.rglob("__init__.py")) if _lazy_exports(p)]
    assert faces, "no lazy package faces found"
    for path in faces:
        imported = {}
        for block in _type_checking_blocks(ast.parse(path.read_text(encoding="utf-8"))):
            for stmt in block.body:
                if isinstance(stmt, ast.ImportFrom):
                    imported |= {alias.asname or alias.name: stmt.module for alias in stmt.names}
        assert imported == _lazy_exports(path), path.relative_to(PACKAGE.parent)


def architecture_tree(text: str) -> set[str]:
    """The paths the tree in docs/architecture.md lists under dspark_cli/ (`capture/run.py`, `capture/`)."""
    block = text.split("## The tree", 1)[1].split("```", 2)[1]
    paths, stack = set(), []
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        if depth == 0:
            stack = [name] if name == "dspark_cli/" else []
            continue
        if not stack:
            continue
        stack = stack[:depth] + [name]
        paths.add("".join(stack[1:]))
    return paths


def test_architecture_tree_lists_every_module():
    """docs/architecture.md's tree names every module and package of dspark_cli/, and nothing that is not there."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    listed = architecture_tree(text)
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    packages = {f"{p.parent.relative_to(PACKAGE)}/" for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    data = {path for path in listed if path.endswith("/") and not (PACKAGE / path / "__init__.py").is_file()}
    assert listed - data == modules | packages, sorted((listed - data) ^ (modules | packages))
    assert all((PACKAGE / path).is_dir() for path in data), data


def test_recipe_has_no_rules():
    """Rules live in preflight/: recipe/ parses (types, ranges, unknown keys) and defines no function that
    returns problem lines (`check_*`, `*_problems`) or a RULES table."""
    found = []
    for path in sorted((PACKAGE / "recipe").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                node.name.lstrip("_").startswith("check") or node.name.endswith("problems")
            ):
                found.append(f"{path.name}:{node.lineno} {node.name}")
            elif isinstance(node, ast.Assign) and any("RULES" in getattr(t, "id", "") for t in node.targets):
                found.append(f"{path.name}:{node.lineno} a rule table")
    assert found == []


def _stage_functions(paths: list[Path]) -> set[str]:
    """`module.name` of every stage function these files import (lazy faces resolved to their modules)."""
    found = set()
    for path in paths:
        for _, module, names in _imports(path):
            parts = module.split(".")
            if len(parts) < 2 or parts[1] not in STAGES:
                continue
            face = _lazy_exports(PACKAGE / parts[1] / "__init__.py") if len(parts) == 2 else {}
            found |= {f"{face.get(name, module)}.{name}" for name in names}
    return found


def test_cli_and_pipeline_call_the_same_stage_entries():
    """`dspark run` (pipeline.py) runs each stage through a function its own command (cli/) calls too, never
    through a wiring of its own (as export once did, calling the writer and skipping export/run.py). The
    capture stage has no command of its own: `dspark train` captures through `ensure_capture`, which runs
    `run_capture`."""
    pipeline = _stage_functions([PACKAGE / "pipeline.py"])
    commands = _stage_functions(sorted((PACKAGE / "cli").glob("*.py")))
    assert pipeline - commands == {"dspark_cli.capture.run.run_capture"}
    for entry in (
        "datagen.run.run_datagen",
        "training.launch.train",
        "export.run.export_checkpoint",
        "bench.run.run_bench",
        "publish.run.publish_draft",
    ):
        assert f"dspark_cli.{entry}" in pipeline & commands, entry


def test_shard_tensors_are_named_only_in_capture_shards():
    """The capture shard format (its tensor names) is known to capture/shards.py alone: everyone else reads
    shards through it (`iter_captured`, `captured_lengths`, `shard_layout`)."""
    tensors = {"input_ids", "loss_mask", "seq_lens", "aux_hidden", "last_hidden"}
    owner = PACKAGE / "capture" / "shards.py"
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == owner:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "get_tensor"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value in tensors
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} get_tensor({node.args[0].value!r})")
            elif isinstance(node, ast.Constant) and node.value in tensors - {"input_ids", "loss_mask"}:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}")
    assert found == []


def test_the_target_is_loaded_only_by_target():
    """Every stage asks `targets.Target` for the target's tokenizer, config, weights and transformers model:
    the loaders (transformers' Auto classes, the hub cache, its embeddings' safetensors) are called in
    targets/ alone (and publish/download.py downloads a published *draft*, never the target)."""
    loaders = {"AutoModelForCausalLM", "AutoTokenizer", "AutoConfig", "snapshot_download", "load_embeddings"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "targets" or path.relative_to(PACKAGE).as_posix() == "publish/download.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = getattr(node, "id", None) or getattr(node, "attr", None)
            if isinstance(node, (ast.Name, ast.Attribute)) and name in loaders:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}")
    assert found == []


TESTS = Path(__file__).resolve().parents[1]
# The test folders beside the stages' (tests/<stage>/): the shared parts, the whole pipeline, the
# benchmarks' own code, and the repository's rules (this file, the docs).
TEST_FOLDERS_BEYOND_STAGES = {"artifacts", "cli", "draft", "preflight", "targets", "e2e", "benchmarks", "project"}


def test_tests_mirror_the_stages_with_an_end_to_end_folder():
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert STAGES <= folders, f"stages without a test folder: {sorted(STAGES - folders)}"
    assert folders - STAGES == TEST_FOLDERS_BEYOND_STAGES, sorted((folders - STAGES) ^ TEST_FOLDERS_BEYOND_STAGES)
    assert not list(TESTS.glob("test_*.py")), "a test file at tests/ itself: put it in its stage's folder"


def test_test_file_names_are_unique_across_folders():
    # conftest.py puts every test folder on sys.path (modules import each other by name): a repeated
    # basename would shadow the other file.
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_stage_entries_return_the_dataclasses_of_artifacts_results():
    """What a stage returns to the commands is typed (artifacts/results.py; bench's is bench.json's records,
    artifacts/bench.py), not a dict read by string keys: each entry's return annotation names only classes
    defined there (or None)."""
    typed = set()
    for module in ("results.py", "bench.py"):
        tree = ast.parse((PACKAGE / "artifacts" / module).read_text(encoding="utf-8"))
        typed |= {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    entries = {
        "datagen/run.py": "run_datagen",
        "capture/run.py": "run_capture",
        "training/run.py": "run_train",
        "export/run.py": "export_checkpoint",
        "bench/run.py": "run_bench",
        "publish/run.py": "publish_draft",
        "capture/producers.py": "supervise",
    }
    entries_also = {"training/run.py": "plan_train", "export/run.py": "meta_plan", "capture/run.py": "ensure_capture"}
    found = {}
    for table in (entries, entries_also):
        for module, name in table.items():
            tree = ast.parse((PACKAGE / module).read_text(encoding="utf-8"))
            function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
            found[name] = set(ast.unparse(function.returns).replace(" ", "").split("|")) - {"None"}
    assert {name: names - typed for name, names in found.items() if names - typed} == {}
    pipeline = ast.parse((PACKAGE / "pipeline.py").read_text(encoding="utf-8"))
    for function in (
        n
        for n in pipeline.body
        if isinstance(n, ast.FunctionDef) and n.name.startswith("run_") and n.name != "run_pipeline"
    ):
        names = set(ast.unparse(function.returns).replace(" ", "").split("|")) - {"None"}
        assert names <= typed, (function.name, names)


def test_recipe_imports_no_stage():
    """recipe/ imports nothing of dspark_cli but `errors`: the stages, the commands and the other libraries
    all read recipes, so an import back from recipe/ is a cycle (the draft's carried recipe is found by
    `artifacts.draft.recipe_of_dir` and handed to recipe/trust.py; the rehearsal is rehearsal.py)."""
    found = []
    for path in sorted((PACKAGE / "recipe").rglob("*.py")):
        for line, module, names in _imports(path):
            parts = module.split(".")
            for target in [parts[1]] if len(parts) > 1 else names:
                if target not in {"recipe", "errors"}:
                    found.append(f"recipe/{path.name}:{line} imports {module} ({target})")
    assert found == []
    assert not ALLOWED["recipe"] & (STAGES | COMMANDS | {"preflight"})


def test_module_names_say_what_they_are():
    """One name, one meaning: the online producers, the live-server bench, training's reader of the stream
    and the trust policy of a carried recipe each have a module named for what it holds, and no module is
    called `online.py` or sits in serving/ while being about recipes."""
    gone = ["capture/online.py", "bench/online.py", "training/online.py", "serving/trust.py"]
    there = ["capture/producers.py", "bench/endpoint.py", "training/stream_source.py", "recipe/trust.py"]
    assert [name for name in gone if (PACKAGE / name).exists()] == []
    assert [name for name in there if not (PACKAGE / name).is_file()] == []


def test_one_training_entry():
    """`dspark train` (cli/train.py) and `dspark run` (pipeline.py) start training through `training.train`
    alone, from the package face: no module outside training/ imports the launch, a rank's training or
    a session (training/launch.py, run.py, session.py; `run_train`, `train_session`, `relaunch_under_torchrun`)."""
    internals = {"dspark_cli.training.launch", "dspark_cli.training.run", "dspark_cli.training.session"}
    names = {"relaunch_under_torchrun", "run_train", "train_session", "TrainRun"}
    found, entries = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "training"):
            continue
        for line, module, imported in _imports(path):
            if module.split(".")[:2] != ["dspark_cli", "training"]:
                continue
            if module in internals or set(imported) & names:
                found.append(f"{path.relative_to(PACKAGE)}:{line} {module} {', '.join(imported)}".rstrip())
            if module == "dspark_cli.training" and "train" in imported:
                entries.add(str(path.relative_to(PACKAGE)))
    assert found == []
    assert entries == {"cli/train.py", "pipeline.py"}
    assert _lazy_exports(PACKAGE / "training" / "__init__.py")["train"] == "dspark_cli.training.launch"
