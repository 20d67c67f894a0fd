"""`dspark bench DRAFT_DIR --offline` on the bundled tiny targets with exported random drafts.

    .venv/bin/python -m pytest tests/bench/test_bench_offline.py -q

Random drafts accept almost nothing, so tau ~ 1; the engine must still reproduce the target's
greedy text token for token (MT-Bench prompts through the tiny chat template), and the command
must write the report and its plots. The trained-draft comparison is tests/bench/test_bench_trained.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from bench_support import export_random_draft
from PIL import Image
from typer.testing import CliRunner

from dspark_cli.cli import app
from dspark_cli.recipe import load_recipe
from dspark_cli.targets import BUNDLED_TARGETS

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not (BUNDLED_TARGETS["tiny-mla"] / "config.json").is_file(), reason="tiny targets not built"),
]


def _recipe(tmp_path: Path, target: str):
    arch = "mla" if target == "tiny-mla" else "gqa"
    return load_recipe(
        "tiny",
        [
            f"target.model={target}",
            f"draft.arch={arch}",
            f"output_dir={tmp_path / 'run'}",
            "bench.datasets=[mt_bench]",
            "bench.num_prompts=2",
            "bench.max_tokens=32",
            "bench.confidence_thresholds=[0.0, 0.6]",
        ],
    )


@pytest.mark.slow  # the engine over MT-Bench prompts on both tiny targets: ~10 s each loaded
@pytest.mark.parametrize("target", ["tiny-mla", "tiny-gqa"])
def test_engine_equals_target_greedy_on_mt_bench(tmp_path, target):
    from dspark_cli.bench.datasets import load_datasets
    from dspark_cli.bench.engine import Sampling
    from dspark_cli.bench.offline import OfflineBench

    recipe = _recipe(tmp_path, target)
    bench = OfflineBench(recipe, export_random_draft(recipe, tmp_path / "draft"))
    conv = load_datasets(recipe.bench)[0].conversations[0]
    prompt = bench.chat.prompt_ids([{"role": "user", "content": conv.user_turns[0]}])
    sampling = Sampling(0.0, 1.0, 48, bench.stop_ids, recipe.target.max_model_len)
    out = bench.engine(0.0).generate(prompt, sampling)
    model = bench.target.model
    with torch.no_grad():
        ref = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=48,
            do_sample=False,
            eos_token_id=sorted(bench.stop_ids),
            pad_token_id=bench.chat.tokenizer.pad_token_id,
        )[0, len(prompt) :].tolist()
    assert out.token_ids == ref[: len(out.token_ids)] and len(out.token_ids) == len(ref)
    assert out.num_steps >= 1 and 1.0 <= out.tau < 1.3


@pytest.mark.slow  # exports a draft and runs `dspark bench --offline`: ~55 s loaded
def test_cli_offline_report_with_the_drafts_own_recipe(tmp_path):
    recipe = _recipe(tmp_path, "tiny-mla")
    draft = export_random_draft(recipe, tmp_path / "draft")
    # the draft's recipe supplies its description (target, geometry); bench settings are the user's
    result = CliRunner().invoke(
        app,
        [
            "bench",
            str(draft),
            "--offline",
            "bench.temperatures=[0.0, 1.0]",
            "bench.datasets=[mt_bench]",
            "bench.num_prompts=2",
            "bench.max_tokens=32",
            "bench.confidence_thresholds=[0.0, 0.6]",
            "bench.model_concurrency=[1, 16, 256]",
            "bench.context_sweep=true",
            "bench.context_sweep_conversations=2",
            "target.max_model_len=512",
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    runs = data["offline"]["runs"]
    assert [(r["dataset"], r["temperature"]) for r in runs] == [("mt_bench", 0.0), ("mt_bench", 1.0)]
    for run in runs:
        assert run["num_turns"] == 4  # 2 MT-Bench questions x 2 turns, answered turn by turn
        assert set(run["by_category"]) == {"writing"}
        assert len(run["acceptance_per_position"]) == recipe.draft.block_size
    # an untrained draft: almost nothing accepted (the de-looped tiny-mla measured 1.17 over these 4 short
    # turns, a trained draft 2+; the same bound as the engine test above)
    assert runs[0]["tau"]["mean"] < 1.3
    sweep = data["offline"]["confidence_sweep"]
    assert [s["threshold"] for s in sweep] == [0.0, 0.6, 0.0, 0.6]
    assert sweep[1]["verified_per_step"] <= sweep[0]["verified_per_step"] == recipe.draft.block_size + 1
    bench_dir = tmp_path / "bench"  # beside the draft (runs/NAME/draft -> runs/NAME/bench), not where its recipe says
    assert Path(data["report_dir"]) == bench_dir and data["files"]["json"] == "bench.json"  # named in the folder
    assert (bench_dir / "bench.md").is_file()
    # the baselines on the same prompts, the adaptive-verification model and the context sweep
    offline = data["offline"]
    assert [(b["name"], b["temperature"]) for b in offline["baselines"]] == [
        ("ngram", 0.0),
        ("ngram", 1.0),
        ("untrained", 0.0),
        ("untrained", 1.0),
    ]
    assert all(b["tau"]["mean"] >= 1.0 for b in offline["baselines"])
    model = offline["adaptive_verification"]
    assert model["cost_model"]["estimate"] is True and "estimate" in model["cost_model"]["label"]
    assert [lv["concurrency"] for lv in model["runs"][0]["levels"]] == [1, 16, 256]
    # the sweep: at the first temperature, 2 conversations of MT-Bench's turns in order, each filled
    # until the next prompt no longer fits 512 tokens (2 questions benched, the sweep reads on)
    [context] = offline["context_sweep"]
    assert context["temperature"] == 0.0 and context["dataset"] == "mt_bench-chained"
    assert context["num_conversations"] == 2 and context["max_model_len"] == 512
    assert (
        context["num_turns"] == sum(context["turns_per_conversation"]) and min(context["turns_per_conversation"]) >= 2
    )
    # well past one turn (383 measured: a conversation ends when the next MT-Bench turn would not fit)
    assert 256 < context["longest_context"] <= 512
    assert context["bins"][-1]["high"] == 512 and context["note"]
    assert runs[0]["calibration"]["overall"]["n"] > 0 and runs[0]["by_context"]
    text = (bench_dir / "bench.md").read_text()
    for title in (
        "### Calibration of the confidence head",
        "### Baselines (same engine, same prompts)",
        "### vLLM adaptive verification across concurrency (model)",
        "### Acceptance by context length",
    ):
        assert title in text
    expected = {
        "acceptance_per_position": ["offline mt_bench T=0", "offline mt_bench T=1"],
        "tau_by_category": ["mt_bench T=0", "mt_bench T=1"],
        "confidence_tradeoff": ["mt_bench T=0", "mt_bench T=1"],
        "calibration": ["mt_bench T=0", "mt_bench T=1"],
        "baselines": ["draft", "ngram", "untrained"],
        "adaptive_verification": [
            "mt_bench T=0 fixed-k",
            "mt_bench T=0 adaptive",
            "mt_bench T=1 fixed-k",
            "mt_bench T=1 adaptive",
            "no speculation",
        ],
        "context_sweep": ["mt_bench-chained T=0 (sweep: 2 conversations)", "mt_bench T=0", "mt_bench T=1"],
    }
    assert set(data["files"]["plots"]) == set(expected)
    for name, series in expected.items():
        with Image.open(bench_dir / f"{name}.png") as image:
            assert image.format == "PNG" and image.size[0] > 300
            assert json.loads(image.text["Description"])["series"] == series


def test_cli_refuses_nothing_to_do_and_missing_dirs(tmp_path):
    result = CliRunner().invoke(app, ["bench", str(tmp_path / "nope"), "--offline"])
    assert result.exit_code == 2 and "draft directory not found" in result.output
    result = CliRunner().invoke(app, ["bench", "--recipe", "tiny", f"output_dir={tmp_path}"])
    assert result.exit_code == 2 and "nothing to benchmark" in result.output


# --- the draft is checked before anything runs, the report dir before the work -------------------------

FAST = ["bench.num_prompts=1", "bench.max_tokens=8", "bench.temperatures=[0.0]", "bench.confidence_thresholds=[0.0]"]


def _resign(draft: Path) -> None:
    import hashlib

    manifest = json.loads((draft / "dspark_manifest.json").read_text())
    manifest["files"] = {n: hashlib.sha256((draft / n).read_bytes()).hexdigest() for n in manifest["files"]}
    (draft / "dspark_manifest.json").write_text(json.dumps(manifest))


def test_a_drafts_recipe_cannot_make_bench_run_the_targets_code(tmp_path):
    import shutil

    import yaml

    recipe = _recipe(tmp_path, "tiny-mla")
    draft = export_random_draft(recipe, tmp_path / "draft")
    evil = tmp_path / "evil-target"  # tiny-mla with "remote code" that leaves a mark when imported
    shutil.copytree(BUNDLED_TARGETS["tiny-mla"], evil)
    marker = tmp_path / "code-ran"
    config = json.loads((evil / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (evil / "config.json").write_text(json.dumps(config))
    (evil / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import DeepseekV3Config as Base\n"
        "class EvilConfig(Base):\n    pass\nEvilModel = None\n"
    )
    data = yaml.safe_load((draft / "recipe.yaml").read_text())
    data["target"].update({"model": str(evil), "trust_remote_code": True})
    (draft / "recipe.yaml").write_text(yaml.safe_dump(data))
    _resign(draft)
    result = CliRunner().invoke(app, ["bench", str(draft), "--offline", *FAST])
    assert not marker.exists(), "the target's code ran"
    assert result.exit_code == 2 and "target.trust_remote_code: True" in result.output, result.output
    # the user's own decision to trust it still meets the contract check before any code is imported
    result = CliRunner().invoke(app, ["bench", str(draft), "--offline", "target.trust_remote_code=true", *FAST])
    assert not marker.exists(), "the target's code ran before the contract check"
    assert result.exit_code == 1 and "trained for target" in result.output, result.output


def test_bench_refuses_bit_flipped_weights_before_running(tmp_path):
    recipe = _recipe(tmp_path, "tiny-mla")
    draft = export_random_draft(recipe, tmp_path / "draft")
    with (draft / "model.safetensors").open("r+b") as handle:
        handle.seek(-3, 2)
        byte = handle.read(1)
        handle.seek(-3, 2)
        handle.write(bytes([byte[0] ^ 0x40]))
    result = CliRunner().invoke(app, ["bench", str(draft), "--offline", *FAST])
    assert result.exit_code == 1 and "model.safetensors: changed since export" in result.output, result.output
    assert not (tmp_path / "bench" / "bench.json").exists()


def test_bench_checks_its_report_directory_before_the_work(tmp_path):
    import os
    import subprocess

    recipe = _recipe(tmp_path, "tiny-mla")
    draft = export_random_draft(recipe, tmp_path / "draft")
    out = tmp_path / "read-only"
    out.mkdir()
    if os.geteuid() == 0:  # root writes through mode bits: make the directory immutable instead
        if subprocess.run(["chattr", "+i", str(out)], capture_output=True).returncode != 0:
            pytest.skip("cannot make a read-only directory here (root without chattr)")
    else:
        out.chmod(0o555)
    try:
        result = CliRunner().invoke(app, ["bench", str(draft), "--offline", f"bench.output_dir={out}", *FAST])
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(out)], check=True)
        out.chmod(0o755)
    # the preflight's writability check refuses it first (bench's own check before the work stays behind it)
    assert result.exit_code == 2 and f"bench.output_dir: cannot write {out}" in result.output, result.output
    assert "tau" not in result.output  # refused before the benchmark ran


# --- a draft's recipe decides no destination: no endpoint, no output directory ---------------------------


@pytest.mark.slow  # in the fast lane at load 7: 23 s
def test_a_drafts_recipe_sends_nothing_anywhere_and_writes_only_beside_the_draft(tmp_path, monkeypatch):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import yaml

    requests: list[str] = []

    class Recorder(BaseHTTPRequestHandler):  # the draft author's server: it only notes what reached it
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            requests.append(self.path)
            self.send_error(404)

        do_POST = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "runs" / "tiny" / "bench"  # the user's own report, from their own run named tiny
    mine.mkdir(parents=True)
    (mine / "bench.md").write_text("# my report\n")
    conversations = tmp_path / "runs" / "tiny" / "data" / "shard-00000.jsonl"  # the user's own data
    conversations.parent.mkdir()
    conversations.write_text(json.dumps({"messages": [{"role": "user", "content": "my private question"}]}) + "\n")
    victim = tmp_path / "elsewhere"
    victim.mkdir()
    (victim / "bench.md").write_text("# not a bench dir\n")
    recipe = _recipe(tmp_path, "tiny-mla")
    draft = export_random_draft(recipe, tmp_path / "downloads" / "foreign" / "draft")
    data = yaml.safe_load((draft / "recipe.yaml").read_text())
    data.update({"name": "tiny", "output_dir": "runs/{name}"})
    data["bench"].update(
        {
            "endpoint": f"http://127.0.0.1:{server.server_address[1]}",
            "output_dir": str(victim),
            "datasets": [str(conversations)],
        }
    )
    (draft / "recipe.yaml").write_text(yaml.safe_dump(data))
    _resign(draft)
    try:
        result = CliRunner().invoke(app, ["bench", str(draft), *FAST])
    finally:
        server.shutdown()
        server.server_close()
    assert requests == [], "the draft's recipe chose the server"
    assert result.exit_code == 0, result.output
    assert (victim / "bench.md").read_text() == "# not a bench dir\n" and len(list(victim.iterdir())) == 1
    assert (mine / "bench.md").read_text() == "# my report\n"
    assert (tmp_path / "downloads" / "foreign" / "bench" / "bench.json").is_file()  # beside the draft


# --- one small offline bench: the draft is read once, and its numbers stay what they were ---------------------

# measured at 78fdbb1 (before the bench read its draft once and typed its report), by this very bench
PINNED: dict[str, list] = {
    "runs": [
        [0.0, 1.0588235294117647, [0.058823529411764705, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]],
        [1.0, 1.5294117647058822, [0.23529411764705882, 0.17647058823529413, 0.11764705882352941, 0.0, 0.0, 0.0, 0.0]],
    ],
    "sweep": [
        [0.0, 0.0, 1.0588235294117647],
        [0.0, 0.5, 1.0],
        [1.0, 0.0, 1.5294117647058822],
        [1.0, 0.5, 1.1304347826086956],
    ],
    "baselines": [
        ["ngram", 0.0, 1.0],
        ["ngram", 1.0, 1.0],
        ["untrained", 0.0, 1.0588235294117647],
        ["untrained", 1.0, 1.5294117647058822],
    ],
    "adaptive": [[0.0, [1.05810546875, 1.059326171875]], [1.0, [1.53955078125, 1.525390625]]],
}


@pytest.mark.slow  # a full offline bench on tiny-mla with both baselines: ~22 s
def test_a_small_offline_bench_reads_the_draft_once_and_keeps_its_numbers(tmp_path, monkeypatch):
    """verify_draft, load_draft_dir and the safetensors read each run once for the engine's drafter and the
    untrained baseline together; tau, acceptance, the sweep, the baselines and the adaptive model are the
    numbers this bench gave before; bench.json reads back into its records and out again unchanged."""
    from collections import Counter

    import safetensors.torch

    from dspark_cli.artifacts import draft as artifacts_draft
    from dspark_cli.artifacts.bench import read_bench_report
    from dspark_cli.bench.run import run_bench
    from dspark_cli.export import integrity

    recipe = load_recipe(
        "tiny",
        [
            "target.model=tiny-mla",
            "draft.arch=mla",
            f"output_dir={tmp_path / 'run'}",
            "bench.datasets=[tiny-eval]",
            "bench.num_prompts=2",
            "bench.max_tokens=16",
            "bench.temperatures=[0.0, 1.0]",
            "bench.confidence_thresholds=[0.0, 0.5]",
            "bench.model_concurrency=[1, 4]",
            "bench.context_sweep=false",
        ],
    )
    draft = export_random_draft(recipe, tmp_path / "draft")
    calls: Counter[str] = Counter()

    def counted(module, name):
        real = getattr(module, name)

        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, call)

    counted(integrity, "verify_draft")
    counted(artifacts_draft, "load_draft_dir")
    counted(safetensors.torch, "load_file")
    summary = run_bench(recipe, draft_dir=draft, offline=True)
    assert calls == {"verify_draft": 1, "load_draft_dir": 1, "load_file": 1}
    offline = summary.offline
    assert offline is not None and offline.adaptive_verification is not None
    measured = {
        "runs": [[r.temperature, r.tau.mean, [p.mean for p in r.acceptance_per_position]] for r in offline.runs],
        "sweep": [[s.temperature, s.threshold, s.tau] for s in offline.confidence_sweep],
        "baselines": [[b.name, b.temperature, b.tau.mean] for b in offline.baselines],
        "adaptive": [
            [r.temperature, [lv.adaptive.tokens_per_step for lv in r.levels]]
            for r in offline.adaptive_verification.runs
        ],
    }
    assert measured == PINNED
    written = json.loads((tmp_path / "run" / "bench" / "bench.json").read_text())
    again = read_bench_report(tmp_path / "run" / "bench" / "bench.json").to_dict()
    assert again == written and list(again) == list(written)
    assert json.dumps(again) == json.dumps(written)  # key order too, all the way down
