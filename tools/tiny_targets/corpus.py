"""The tiny targets' chat corpus: the running Python's standard library as instruction -> response pairs.

    python -m tools.tiny_targets.corpus            # counts per split and task, and three samples

Every machine has the stdlib source, under the PSF license, so the corpus is rebuilt rather than shipped.
Each top-level function, method, class and module with a docstring becomes one or more chat turns:

- code:      "Write a Python function `name(args)` that <docstring summary>."  -> the dedented source
- explain:   "Explain what `module.qualname` does."                              -> the docstring's first paragraph
- signature: "What is the signature of `module.qualname`?"                     -> "`name(args)`"
- module:    "What is the `module` module for?"                                  -> the module docstring's first paragraph

The split is by a hash of the *object's* qualified name, so every task about a held-out object is held out:
the evaluation prompts were never seen in training, not even as another task on the same function.
The corpus depends on the Python version (record it next to anything trained on it).
"""

from __future__ import annotations

import ast
import hashlib
import os
import sys
import sysconfig
import textwrap
from dataclasses import dataclass, field

# Whole sub-trees that are tests, vendored code or GUI demos: not the "library" a user would ask about.
_SKIP_DIRS = {
    "site-packages",
    "test",
    "tests",
    "idlelib",
    "turtledemo",
    "lib2to3",
    "ensurepip",
    "__pycache__",
    "tkinter",
    "config-3.11-x86_64-linux-gnu",
}
# Responses are kept short: a tiny model can learn to finish (EOS) and to close its blocks only on
# answers that fit its context comfortably, and short answers keep the build inside its time budget.
MAX_CODE_LINES = 14
MAX_CODE_CHARS = 520
MAX_TEXT_CHARS = 360
HELD_OUT_PERCENT = 6

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a concise Python expert. Answer with code or one short paragraph.",
    "You answer questions about the Python standard library.",
)


@dataclass(frozen=True)
class Pair:
    """One single-turn conversation. `key` is the object it is about (the split key), `task` its kind."""

    key: str
    task: str
    prompt: str
    response: str
    system: str | None = None

    def messages(self) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": self.prompt}, {"role": "assistant", "content": self.response}]


@dataclass
class Corpus:
    train: list[Pair] = field(default_factory=list)
    held_out: list[Pair] = field(default_factory=list)


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def python_version() -> str:
    return ".".join(str(v) for v in sys.version_info[:3])


def _stable_hash(text: str) -> int:
    # Python's hash() is salted per process; sha256 keeps the split identical across runs and machines.
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def is_held_out(key: str) -> bool:
    return _stable_hash(key) % 100 < HELD_OUT_PERCENT


def _first_paragraph(doc: str) -> str | None:
    para = " ".join(line.strip() for line in doc.strip().split("\n\n")[0].splitlines()).strip()
    if len(para) < 12 or len(para) > MAX_TEXT_CHARS or not para.isascii():
        return None
    return para


def _summary(doc: str) -> str | None:
    para = _first_paragraph(doc)
    if para is None:
        return None
    sentence = para.split(". ")[0].rstrip(".")
    # "Return the x" -> "returns the x" reads as a request: "... that returns the x".
    words = sentence.split(" ", 1)
    verb = words[0].lower()
    if verb.endswith("s") or len(words) < 2:
        return None if len(words) < 2 else sentence[0].lower() + sentence[1:]
    return f"{verb}s {words[1]}" if not verb.endswith(("sh", "ch", "x")) else f"{verb}es {words[1]}"


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return f"{node.name}({ast.unparse(node.args)})"


def _module_name(path: str, root: str) -> str:
    rel = os.path.relpath(path, root)[: -len(".py")].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _code_of(lines: list[str], node: ast.stmt) -> str | None:
    # Slicing pre-split lines: ast.get_source_segment re-splits the whole file per call (minutes on the stdlib).
    if node.end_lineno is None or node.end_lineno - node.lineno >= MAX_CODE_LINES:
        return None
    code = textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno])).rstrip() + "\n"
    if len(code) > MAX_CODE_CHARS or code.count("\n") > MAX_CODE_LINES or not code.isascii() or "\t" in code:
        return None
    try:
        ast.parse(code)
    except SyntaxError:
        return None
    return code


def pairs_of_module(path: str, root: str) -> list[Pair]:
    """Every pair one stdlib file yields, in source order (deterministic)."""
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    module = _module_name(path, root)
    lines = source.splitlines(keepends=True)
    pairs: list[Pair] = []
    doc = ast.get_docstring(tree)
    if doc and (para := _first_paragraph(doc)):
        pairs.append(Pair(module, "module", f"What is the `{module}` module for?", para))

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not prefix:
                qual = f"{module}.{node.name}"
                if (cdoc := ast.get_docstring(node)) and (para := _first_paragraph(cdoc)):
                    pairs.append(Pair(qual, "explain", f"Explain what the class `{qual}` is for.", para))
                visit(node.body, node.name + ".")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                pairs.extend(_function_pairs(lines, node, module, prefix))

    visit(tree.body, "")
    return pairs


def _function_pairs(
    lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef, module: str, prefix: str
) -> list[Pair]:
    qual = f"{module}.{prefix}{node.name}"
    sig = _signature(node)
    out = [Pair(qual, "signature", f"What is the signature of `{qual}`?", f"`{sig}`")]
    fdoc = ast.get_docstring(node)
    if fdoc and (para := _first_paragraph(fdoc)):
        out.append(Pair(qual, "explain", f"Explain what `{qual}` does.", para))
    code = _code_of(lines, node)
    if code is not None and not node.name.startswith("__"):
        summary = _summary(fdoc) if fdoc else None
        what = f" that {summary}" if summary else f" in the style of `{module}`"
        kind = f"the method `{prefix}{sig}`" if prefix else f"a Python function `{sig}`"
        out.append(Pair(qual, "code", f"Write {kind}{what}.", code))
    return out


def stdlib_files(root: str | None = None) -> list[str]:
    """Sorted .py files of the stdlib, test and GUI trees skipped (sorted walk = deterministic corpus)."""
    root = root or stdlib_dir()
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(("test", "_test")))
        found.extend(
            os.path.join(dirpath, f)
            for f in sorted(filenames)
            if f.endswith(".py") and not f.startswith(("test_", "_test"))
        )
    return sorted(found)


def build_corpus(root: str | None = None) -> Corpus:
    """All pairs, split by object. One pair in three (by hash) gets a system prompt, as real chats vary."""
    root = root or stdlib_dir()
    corpus = Corpus()
    seen: set[tuple[str, str]] = set()
    for path in stdlib_files(root):
        for pair in pairs_of_module(path, root):
            if (pair.prompt, pair.response) in seen:
                continue
            seen.add((pair.prompt, pair.response))
            h = _stable_hash(pair.prompt)
            if h % 3 == 0:
                pair = Pair(
                    pair.key, pair.task, pair.prompt, pair.response, SYSTEM_PROMPTS[h // 3 % len(SYSTEM_PROMPTS)]
                )
            (corpus.held_out if is_held_out(pair.key) else corpus.train).append(pair)
    return corpus


def eval_prompts(corpus: Corpus, num_code: int = 30, num_text: int = 20) -> list[Pair]:
    """The fixed held-out evaluation set: `num_code` code tasks and `num_text` explain/signature/module tasks.

    Picked by hash, not by position, so they spread over the whole stdlib; the shortest references are not
    preferred, so the EOS and parse shares are not flattered.
    """
    ranked = sorted(corpus.held_out, key=lambda p: _stable_hash("eval:" + p.prompt))
    code = [p for p in ranked if p.task == "code"][:num_code]
    text = [p for p in ranked if p.task != "code"][:num_text]
    return code + text


def main() -> None:
    corpus = build_corpus()
    for name, pairs in (("train", corpus.train), ("held_out", corpus.held_out)):
        by_task: dict[str, int] = {}
        for p in pairs:
            by_task[p.task] = by_task.get(p.task, 0) + 1
        chars = sum(len(p.prompt) + len(p.response) for p in pairs)
        print(f"{name}: {len(pairs)} pairs, {chars / 1e6:.2f} M chars, {dict(sorted(by_task.items()))}")
    print(f"python {python_version()} stdlib at {stdlib_dir()}")
    for p in eval_prompts(corpus)[:2] + eval_prompts(corpus)[-1:]:
        print("---", p.messages())


if __name__ == "__main__":
    main()
