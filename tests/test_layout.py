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

PACKAGE = Path(__file__).resolve().parents[1] / "dspark_cli"

# The stages, in data-flow order: each one's package __init__ is its public face to the others.
STAGES = {"datagen", "capture", "training", "export", "bench", "serving", "publish"}
COMMANDS = {"cli", "pipeline"}  # wiring: may import any module of any stage

# Who may import whom, written once. Shared libraries first, then the stages, then the commands.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "lazy": set(),  # package faces that import their modules on first use
    "contract": {"errors"},
    "hubrules": set(),
    "network": {"errors"},  # timeouts and response bounds of every HTTP exchange (bench, publish)
    "recipe": {"errors", "artifacts", "targets", "hubrules"},
    "targets": {"errors", "contract", "recipe"},
    "artifacts": {"errors", "contract", "draft", "recipe"},
    "prompts": {"errors", "recipe"},
    "kernels": set(),
    "procs": set(),  # children that die with their parent
    "draft": {"errors", "contract", "kernels"},
    "ui": {"errors", "hubrules"},
    "datagen": {"errors", "lazy", "recipe", "targets", "artifacts", "prompts", "procs"},
    "capture": {"errors", "lazy", "contract", "recipe", "targets", "artifacts", "procs"},
    "training": {"errors", "contract", "recipe", "targets", "artifacts", "draft", "kernels", "capture", "procs"},
    "export": {"errors", "lazy", "contract", "recipe", "targets", "artifacts", "draft"},
    "bench": {"errors", "recipe", "targets", "artifacts", "prompts", "draft", "export", "network"},
    "serving": {"errors", "lazy", "recipe", "targets", "artifacts", "export", "procs"},
    "publish": {"errors", "lazy", "hubrules", "artifacts", "export", "serving", "network"},
    # the one preflight of every stage: recipe rules, this machine, output paths (what serve / publish refuse)
    "preflight": {"errors", "lazy", "recipe", "targets", "artifacts", "prompts", "datagen", "capture", "export",
                  "serving", "publish"},
    "pipeline": {"errors", "recipe", "artifacts", "datagen", "capture", "training", "export", "bench", "publish"},
    "cli": {"errors", "recipe", "targets", "ui", "pipeline", "datagen", "capture", "training", "export", "bench",
            "serving", "publish", "artifacts", "prompts", "draft", "kernels", "contract", "preflight"},
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
                if target == source or target.startswith("__") or not (root / target).exists() and \
                        not (root / f"{target}.py").exists():
                    continue
                if target not in ALLOWED[source]:
                    problems.append(f"{where}:{line}: {source} imports {module} ({source} -> {target} not allowed)")
                elif target in STAGES and source not in COMMANDS:
                    submodules = [n for n in names if (root / target / f"{n}.py").exists()] if not inner else inner
                    if inner or submodules:
                        problems.append(f"{where}:{line}: {source} imports {target}'s internals ({module}"
                                        f"{' ' + ', '.join(submodules) if not inner else ''}); import the name "
                                        f"from dspark_cli.{target} (its __init__ exports)")
    return problems


def test_the_package_follows_the_layout():
    assert forbidden_edges(PACKAGE) == []


def test_every_allowed_part_exists():
    parts = {_part(p, PACKAGE) for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    parts -= {"__init__", "__main__"}
    assert parts == set(ALLOWED), (parts ^ set(ALLOWED))


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
    assert publish_z.startswith("dspark_cli/publish/z.py:1: publish imports export's internals (dspark_cli.export "
                                "integrity)")
    assert targets_x.endswith("(targets -> bench not allowed)")
