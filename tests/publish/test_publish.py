"""`dspark publish`: a real `dspark` process uploads over HTTP to a loopback Hugging Face Hub and ModelScope.

The servers (tests/hub_server.py) speak the endpoints the two clients use: for huggingface_hub,
create repo, validate the card's YAML, preupload, git-LFS batch + PUT, NDJSON commit; for
modelscope, /api/v1/models, its LFS batch + PUT and its JSON commit. Xet storage is the one part
not emulated, so the processes run with HF_HUB_DISABLE_XET=1 (huggingface_hub's own switch to plain LFS).
The draft is a freshly initialised tiny-mla draft exported by `dspark export`: publishing does not
care how good it is. The bench report beside it is written by the test (its numbers are inputs the
card must repeat, not measurements).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from bench_support import export_random_draft
from hub_server import LoopbackHub, LoopbackModelScope
from typer.testing import CliRunner

from dspark_cli.cli import app
from dspark_cli.recipe import load_recipe

pytestmark = pytest.mark.slow  # a real `dspark publish` process per test against loopback hubs: 20-80 s loaded

DSPARK = str(Path(sys.executable).with_name("dspark"))
TOKEN = "hf_loopback_test_token"
MS_TOKEN = "ms_loopback_test_token"
REPO = "dspark-tests/tiny-mla-dspark"
runner = CliRunner()


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """runs/<tmp>/draft as `dspark export` leaves it, plus a bench report that measured it."""
    root = tmp_path_factory.mktemp("publish")
    recipe = load_recipe("tiny", [f"output_dir={root}"])
    draft = export_random_draft(recipe, root / "draft")
    bench = root / "bench"
    bench.mkdir()
    (bench / "bench.md").write_text("# bench\n", encoding="utf-8")
    (bench / "bench.json").write_text(
        json.dumps(
            {
                "kind": "dspark.bench",
                "draft_dir": "../draft",  # as bench records it: relative to its folder, and by its manifest
                "draft_sha256": _manifest_sha(draft),
                "offline": {
                    "runs": [
                        {
                            "dataset": "tiny-eval",
                            "temperature": 0.0,
                            "threshold": 0.0,
                            "num_turns": 20,
                            "tau": {"mean": 2.25, "ci95": [2.0, 2.5], "n": 100},
                        },
                        {
                            "dataset": "tiny-eval",
                            "temperature": 0.0,
                            "threshold": 0.5,
                            "num_turns": 20,
                            "tau": {"mean": 2.0, "ci95": [1.8, 2.2], "n": 100},
                        },
                    ]
                },
                "files": {"checksums": {"bench.md": hashlib.sha256(b"# bench\n").hexdigest()}},
            }
        ),
        encoding="utf-8",
    )
    return draft


def copy_of(exported: Path, tmp_path: Path) -> Path:
    """A private copy of the run (draft + bench), with its recipe pointing at the copy."""
    shutil.copytree(exported.parent, tmp_path / "run")
    draft = tmp_path / "run" / "draft"
    recipe = yaml.safe_load((draft / "recipe.yaml").read_text())
    recipe["output_dir"] = str(tmp_path / "run")
    (draft / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    resign(draft)
    bench = json.loads((tmp_path / "run" / "bench" / "bench.json").read_text())
    bench["draft_sha256"] = _manifest_sha(draft)  # re-signed: the report measured this manifest
    (tmp_path / "run" / "bench" / "bench.json").write_text(json.dumps(bench))
    return draft


def _manifest_sha(draft: Path) -> str:
    return hashlib.sha256((draft / "dspark_manifest.json").read_bytes()).hexdigest()


def resign(draft: Path) -> None:
    """Record the current checksums of the draft's files in its manifest, as export (or a forger) would."""
    manifest = json.loads((draft / "dspark_manifest.json").read_text())
    manifest["files"] = {name: hashlib.sha256((draft / name).read_bytes()).hexdigest() for name in manifest["files"]}
    (draft / "dspark_manifest.json").write_text(json.dumps(manifest))


def publish(
    *args: str,
    hub: LoopbackHub | None,
    token: str | None = TOKEN,
    home: Path,
    ms: LoopbackModelScope | None = None,
    ms_token: str | None = MS_TOKEN,
) -> subprocess.CompletedProcess:
    """`dspark publish ARGS` with only these hubs and tokens visible (HOME too: no stored logins). The suite
    runs offline (scripts/dev.sh sets HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE, which huggingface_hub also
    honours); these processes may reach the loopback servers only."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODELSCOPE_")) and k != "TRANSFORMERS_OFFLINE"
    }
    env.update(
        {
            "HOME": str(home),
            "HF_HOME": str(home / "hf"),
            "MODELSCOPE_CACHE": str(home / "ms"),
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "PYTHONWARNINGS": "ignore",
            "COLUMNS": "200",
        }
    )
    if hub is not None:
        env["HF_ENDPOINT"] = hub.url
    if token is not None:
        env["HF_TOKEN"] = token
    if ms is not None:
        env["MODELSCOPE_ENDPOINT"] = ms.url
        # ModelScope's client retries a failed commit 5 times with growing waits (about a minute in
        # all); the loopback server's failures are deliberate, so one retry shows the same behaviour
        env["MODELSCOPE_UPLOAD_COMMIT_MAX_ATTEMPTS"] = "2"
    if ms_token is not None:
        env["MODELSCOPE_API_TOKEN"] = ms_token
    return subprocess.run([DSPARK, "publish", *args], capture_output=True, text=True, env=env, timeout=120)


def test_publish_commits_the_draft_and_its_model_card_in_one_commit(exported, tmp_path):
    with LoopbackHub(TOKEN) as hub:
        out = publish(str(exported), "--repo-id", REPO, hub=hub, home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"published to huggingface: {hub.url}/{REPO}/commit/" in out.stdout
    repo = hub.repos[REPO]
    assert repo.private and len(repo.commits) == 1 and "K3DSparkModel" in repo.commits[0]
    expected = {
        "config.json",
        "model.safetensors",
        "dspark_manifest.json",
        "recipe.yaml",
        "README.md",
        "bench/bench.json",
        "bench/bench.md",
    }
    assert set(repo.files) == expected
    for name in ("config.json", "model.safetensors", "dspark_manifest.json", "recipe.yaml"):
        assert repo.files[name] == (exported / name).read_bytes(), name  # byte for byte, LFS included
    assert [method for method, _ in hub.requests].count("PUT") == 1  # model.safetensors went through git-LFS

    card = repo.files["README.md"].decode()
    (meta,) = hub.card_metadata  # the hub validated the card's front matter
    assert meta["license"] == "apache-2.0" and "dspark" in meta["tags"] and meta["library_name"] == "vllm"
    manifest = json.loads((exported / "dspark_manifest.json").read_text())
    spec = json.loads(card.split("--speculative-config '")[1].split("'")[0])
    assert spec == {
        "method": "dspark",
        "model": REPO,
        "num_speculative_tokens": manifest["contract"]["block_size"],
        "draft_sample_method": "probabilistic",
        "rejection_sample_method": "block",
    }
    assert "vllm serve tiny-mla " in card and str(exported.parent) not in card  # no local paths on the card
    assert "| tiny-eval | 0 | 20 | 2.25 [2.00, 2.50] |" in card  # threshold-0 runs only
    assert card.count("| tiny-eval |") == 1
    assert f"| target layer ids | {manifest['contract']['target_layer_ids']} |" in card


def test_public_flag_and_republishing_to_an_existing_repo(exported, tmp_path):
    with LoopbackHub(TOKEN) as hub:
        first = publish(str(exported), "--repo-id", REPO, "--public", hub=hub, home=tmp_path)
        second = publish(str(exported), "--repo-id", REPO, hub=hub, home=tmp_path)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert not hub.repos[REPO].private and len(hub.repos[REPO].commits) == 2


def test_refusals_before_anything_is_sent(exported, tmp_path):
    with LoopbackHub(TOKEN) as hub:
        no_token = publish(str(exported), "--repo-id", REPO, hub=hub, token=None, home=tmp_path)
        assert no_token.returncode == 2 and "no Hugging Face token found" in no_token.stderr
        no_repo = publish(str(exported), hub=hub, home=tmp_path)
        assert no_repo.returncode == 2 and "publish needs a destination repo" in no_repo.stderr

        draft = copy_of(exported, tmp_path)
        with (draft / "model.safetensors").open("r+b") as handle:  # one flipped byte in the weights
            handle.seek(-1, os.SEEK_END)
            last = handle.read(1)
            handle.seek(-1, os.SEEK_END)
            handle.write(bytes([last[0] ^ 1]))
        changed = publish(str(draft), "--repo-id", REPO, hub=hub, home=tmp_path)
        assert changed.returncode == 1 and "changed since export" in changed.stderr

        draft = copy_of(exported, tmp_path / "b")
        config = json.loads((draft / "config.json").read_text())
        config["num_target_layers"] += 1  # a rule vLLM's loader enforces
        (draft / "config.json").write_text(json.dumps(config))
        resign(draft)  # checksums that match: the loader rule itself must refuse it
        broken = publish(str(draft), "--repo-id", REPO, hub=hub, home=tmp_path)
        assert broken.returncode == 1 and "num_target_layers" in broken.stderr
        assert "nothing was uploaded" in broken.stderr
    for out in (no_token, no_repo, changed, broken):
        assert len(out.stderr.strip().splitlines()) == 2, out.stderr  # one error line, one hint, no traceback
    assert hub.requests == [] and hub.repos == {}


def test_hub_errors_are_one_line_and_leave_no_partial_repo(exported, tmp_path):
    with LoopbackHub(TOKEN, fail_commits=1) as hub:
        wrong = publish(str(exported), "--repo-id", REPO, hub=hub, token="hf_wrong", home=tmp_path)
        failed = publish(str(exported), "--repo-id", REPO, hub=hub, home=tmp_path)
    assert wrong.returncode == 1 and "Hugging Face refused the upload" in wrong.stderr and "401" in wrong.stderr
    assert failed.returncode == 1 and "500" in failed.stderr
    for out in (wrong, failed):
        assert len(out.stderr.strip().splitlines()) == 2, out.stderr
    assert hub.repos[REPO].files == {}  # the commit failed as a whole: nothing half-published
    with LoopbackHub(TOKEN) as hub:
        pass  # closed: nothing listens on its port any more
    unreachable = publish(str(exported), "--repo-id", REPO, hub=hub, home=tmp_path)
    assert unreachable.returncode == 1 and "cannot reach Hugging Face" in unreachable.stderr


def test_dry_run_lists_the_upload_and_the_card_without_a_network(exported):
    result = runner.invoke(app, ["publish", str(exported), "--repo-id", REPO, "--dry-run", "--format", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["dry_run"] and plan["urls"] == {} and plan["card"] == "generated"
    assert {f["path"] for f in plan["files"]} >= {"README.md", "model.safetensors", "bench/bench.json"}
    assert plan["card_text"].startswith("---\nlicense: apache-2.0\n")
    text = runner.invoke(app, ["publish", str(exported), "--repo-id", REPO, "--dry-run"])
    assert text.exit_code == 0 and "dry run, nothing uploaded" in text.output


def test_an_existing_readme_is_published_as_is(exported, tmp_path):
    draft = copy_of(exported, tmp_path)
    (draft / "README.md").write_text("---\nlicense: mit\n---\n# my own card\n")
    result = runner.invoke(app, ["publish", str(draft), "--repo-id", REPO, "--dry-run", "--format", "json"])
    plan = json.loads(result.output)
    assert plan["card"] == "README.md in the draft directory" and plan["card_text"].endswith("# my own card\n")


def test_both_hubs_get_the_same_files_in_one_commit_each(exported, tmp_path):
    with LoopbackHub(TOKEN) as hub, LoopbackModelScope(MS_TOKEN) as ms:
        out = publish(
            str(exported),
            "--repo-id",
            REPO,
            "--hub",
            "huggingface",
            "--hub",
            "modelscope",
            hub=hub,
            ms=ms,
            home=tmp_path,
        )
    assert out.returncode == 0, out.stderr
    assert f"published to modelscope: {ms.url}/models/{REPO}" in out.stdout
    hf_repo, ms_repo = hub.repos[REPO], ms.repos[REPO]
    assert ms_repo.private and len(ms_repo.commits) == 1 and len(hf_repo.commits) == 1
    assert ms_repo.files == hf_repo.files  # README.md and bench/ included
    assert ms_repo.files["model.safetensors"] == (exported / "model.safetensors").read_bytes()
    assert ("PUT", f"/lfs-put/{hashlib.sha256(ms_repo.files['model.safetensors']).hexdigest()}") in ms.requests
    assert not list(exported.parent.glob(".draft.publish-*"))  # the staging folder is gone


def test_modelscope_refusals(exported, tmp_path):
    with LoopbackHub(TOKEN) as hub, LoopbackModelScope(MS_TOKEN) as ms:
        no_token = publish(
            str(exported),
            "--repo-id",
            REPO,
            "--hub",
            "huggingface",
            "--hub",
            "modelscope",
            hub=hub,
            ms=ms,
            ms_token=None,
            home=tmp_path,
        )
        assert no_token.returncode == 2 and "no ModelScope token found" in no_token.stderr
        assert hub.requests == [] and ms.requests == []  # every token is checked before the first upload
        wrong = publish(
            str(exported),
            "--repo-id",
            REPO,
            "--hub",
            "huggingface",
            "--hub",
            "modelscope",
            hub=hub,
            ms=ms,
            ms_token="ms_wrong",
            home=tmp_path,
        )
    assert wrong.returncode == 1 and "ModelScope refused the upload" in wrong.stderr
    # the first hub did get it: the error says so rather than leaving the user to guess
    assert f"already published to huggingface ({hub.url}/{REPO}/commit/" in wrong.stderr
    for out in (no_token, wrong):
        assert len(out.stderr.strip().splitlines()) == 2, out.stderr
    assert ms.repos == {} and not list(exported.parent.glob(".draft.publish-*"))


def test_run_with_publish_checks_the_destination_and_tokens_before_the_first_stage(tmp_path):
    no_repo = runner.invoke(app, ["run", "tiny", f"output_dir={tmp_path / 'a'}", "--publish"])
    assert no_repo.exit_code == 2 and "publish needs a destination repo" in no_repo.output
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODELSCOPE_"))}
    env.update({"HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"), "PYTHONWARNINGS": "ignore"})
    no_token = subprocess.run(
        [DSPARK, "run", "tiny", f"output_dir={tmp_path / 'b'}", f"publish.repo_id={REPO}", "--publish"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert no_token.returncode == 2 and "no Hugging Face token found" in no_token.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # no stage ran


def test_a_drafts_recipe_chooses_neither_the_repo_nor_its_visibility(exported, tmp_path):
    # `dspark publish DRAFT` with no flags created the repo the draft's recipe named, public
    draft = copy_of(exported, tmp_path)
    recipe = yaml.safe_load((draft / "recipe.yaml").read_text())
    recipe["publish"].update({"private": False, "repo_id": "victim-org/prod-model", "hubs": ["huggingface"]})
    (draft / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    resign(draft)
    with LoopbackHub(TOKEN) as hub:
        bare = publish(str(draft), hub=hub, home=tmp_path)
        assert hub.requests == [] and hub.repos == {}, bare.stdout
        mine = publish(str(draft), "--repo-id", REPO, hub=hub, home=tmp_path)
    assert bare.returncode == 2 and "publish needs a destination repo" in bare.stderr, bare.stderr
    assert mine.returncode == 0, mine.stderr
    assert set(hub.repos) == {REPO} and hub.repos[REPO].private


def test_publish_uploads_only_the_bench_files_bench_listed(exported, tmp_path):
    # the bench/ folder went up as it was, a symlink to a secret and a screenshot included
    draft = copy_of(exported, tmp_path)
    bench = draft.parent / "bench"
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's secret\n")
    (bench / "zz-link.png").symlink_to(secret)
    (bench / "screenshot.png").write_bytes(b"\x89PNG not from bench")
    with LoopbackHub(TOKEN) as hub:
        out = publish(str(draft), "--repo-id", REPO, hub=hub, home=tmp_path)
        assert out.returncode == 0, out.stderr
        assert {p for p in hub.repos[REPO].files if p.startswith("bench/")} == {"bench/bench.json", "bench/bench.md"}
        assert b"the user's secret" not in b"".join(hub.repos[REPO].files.values())
        report = json.loads((bench / "bench.json").read_text())
        for name, problem in (
            ("zz-link.png", "is a symlink"),
            ("../secret.txt", "is not a file name"),
            ("bench.md", "changed since dspark bench wrote it"),
        ):
            report["files"]["checksums"] = {name: hashlib.sha256(b"# bench\n").hexdigest()}
            (bench / "bench.json").write_text(json.dumps(report))
            if name == "bench.md":
                (bench / "bench.md").write_text("# bench, edited\n")
            refused = publish(str(draft), "--repo-id", "dspark-tests/other", hub=hub, home=tmp_path)
            assert refused.returncode == 1 and problem in refused.stderr, refused.stderr
            assert len(refused.stderr.strip().splitlines()) == 2, refused.stderr
    assert set(hub.repos) == {REPO}


def test_a_one_prompt_bench_report_makes_a_card(exported, tmp_path):
    # a tau without a confidence interval (one prompt) was a TypeError in the card
    draft = copy_of(exported, tmp_path)
    report_file = draft.parent / "bench" / "bench.json"
    report = json.loads(report_file.read_text())
    report["offline"]["runs"][0]["tau"] = {"mean": 1.5, "ci95": [None, None], "n": 1}
    report_file.write_text(json.dumps(report))
    result = runner.invoke(app, ["publish", str(draft), "--repo-id", REPO, "--dry-run", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert "| tiny-eval | 0 | 20 | 1.50 |" in json.loads(result.output)["card_text"]
    report["complete"] = False  # a bench that stopped half-way (bench.json is written as results come)
    report_file.write_text(json.dumps(report))
    result = runner.invoke(app, ["publish", str(draft), "--repo-id", REPO, "--dry-run", "--format", "json"])
    plan = json.loads(result.output)
    assert "Measured acceptance" not in plan["card_text"] and not any(
        f["path"].startswith("bench/") for f in plan["files"]
    )


# --- an allow-list of what export wrote, integrity and trust --------------------------------------------


def test_publish_uploads_only_the_files_export_wrote(exported, tmp_path):
    draft = copy_of(exported, tmp_path)
    for name in ("id_rsa", "server.pem", "credentials.json", "token", ".env"):
        (draft / name).write_text("secret\n")
    (draft / "shadow").symlink_to("/etc/shadow")
    with LoopbackHub(TOKEN) as hub:
        out = publish(str(draft), "--repo-id", REPO, hub=hub, home=tmp_path)
        dry = runner.invoke(app, ["publish", str(draft), "--repo-id", REPO, "--dry-run"])
    assert out.returncode == 1, out.stdout
    assert "files export did not write" in out.stderr and "nothing was uploaded" in out.stderr
    for name in ("id_rsa", "server.pem", "credentials.json", "token", ".env", "shadow (symlink)"):
        assert name in out.stderr, name
    assert len(out.stderr.strip().splitlines()) == 2, out.stderr
    assert hub.requests == [] and hub.repos == {}
    assert dry.exit_code == 1 and "id_rsa" in dry.output


def test_publish_refuses_a_symlinked_export_file(exported, tmp_path):
    draft = copy_of(exported, tmp_path)
    real = tmp_path / "elsewhere.safetensors"
    (draft / "model.safetensors").rename(real)
    (draft / "model.safetensors").symlink_to(real)
    result = runner.invoke(app, ["publish", str(draft), "--repo-id", REPO, "--dry-run"])
    assert result.exit_code == 1 and "model.safetensors: is a symlink" in result.output, result.output


def test_publish_dry_run_refuses_another_target_and_foreign_serving_env(exported, tmp_path):
    other = runner.invoke(app, ["publish", str(exported), "--repo-id", REPO, "--dry-run", "target.model=tiny-gqa"])
    assert other.exit_code == 1 and "trained for target 'tiny-mla'" in other.output, other.output
    draft = copy_of(exported, tmp_path)
    manifest = json.loads((draft / "dspark_manifest.json").read_text())
    manifest["serving"]["env"] = {"LD_PRELOAD": "/tmp/evil.so", "PYTHONPATH": "/tmp/evil"}
    (draft / "dspark_manifest.json").write_text(json.dumps(manifest))
    env = runner.invoke(app, ["publish", str(draft), "--repo-id", REPO, "--dry-run"])
    assert env.exit_code == 1 and "serving.env: sets LD_PRELOAD, PYTHONPATH" in env.output, env.output


def test_a_hub_that_echoes_the_authorization_header_never_shows_the_token(exported, tmp_path):
    # servers that repeat `Authorization: Bearer <token>` in an error body
    secret_hf, secret_ms = "hf_SecretLoopbackToken123456", "ms-secret-loopback-token-987654"
    both = ("--hub", "huggingface", "--hub", "modelscope")
    with (
        LoopbackHub(secret_hf, fail_commits=1, echo_auth=True) as hub,
        LoopbackModelScope(secret_ms, fail_commits=10, echo_auth=True) as ms,
    ):  # more than its client retries
        hf_wrong = publish(str(exported), "--repo-id", REPO, hub=hub, token="hf_WrongButStillSecret99", home=tmp_path)
        hf_failed = publish(str(exported), "--repo-id", REPO, hub=hub, token=secret_hf, home=tmp_path)
        ms_wrong = publish(
            str(exported),
            "--repo-id",
            REPO,
            *both,
            hub=hub,
            token=secret_hf,
            ms=ms,
            ms_token="ms-wrong-but-still-secret-42",
            home=tmp_path,
        )
        ms_failed = publish(
            str(exported), "--repo-id", REPO, *both, hub=hub, token=secret_hf, ms=ms, ms_token=secret_ms, home=tmp_path
        )
    for out, secret in (
        (hf_wrong, "hf_WrongButStillSecret99"),
        (hf_failed, secret_hf),
        (ms_wrong, "ms-wrong-but-still-secret-42"),
        (ms_failed, secret_ms),
    ):
        assert out.returncode == 1, out.stderr
        if secret in (secret_hf, "hf_WrongButStillSecret99"):  # ModelScope's echoes were in its (now quiet) logs
            assert "Bearer ***" in out.stderr, out.stderr  # the server did echo it: the test sees the scrubbed echo
        for text in (out.stdout, out.stderr):
            assert secret not in text and secret_hf not in text and secret_ms not in text, text
        error, hint = out.stderr.strip().splitlines()  # ModelScope's retries are not logged
        assert error.startswith("error: ") and hint.startswith("hint: "), out.stderr
    assert "ModelScope refused the upload" in ms_wrong.stderr and "500" in ms_failed.stderr


def test_every_hub_without_a_token_is_named(exported, tmp_path):
    out = publish(
        str(exported),
        "--repo-id",
        REPO,
        "--hub",
        "huggingface",
        "--hub",
        "modelscope",
        hub=None,
        token=None,
        ms=None,
        ms_token=None,
        home=tmp_path,
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 2, out.stderr
    assert "no token found for Hugging Face or ModelScope" in out.stderr
    assert "hf auth login" in out.stderr and "modelscope login" in out.stderr


@pytest.mark.parametrize(
    ("repo_id", "expected"),
    [
        ("me/" + "x" * 200, "its name is 200 characters long; the hubs allow at most 96"),
        ("o" * 97 + "/draft", "its owner is 97 characters long"),
        ("me/my draft", "its name 'my draft' may hold only letters, digits, '_', '-' and '.'"),
        ("me/-draft", "its name '-draft' may hold only letters, digits, '_', '-' and '.', and may not start or end"),
        ("me/a--b", "contains '--' or '..'"),
        ("me/draft.git", "ends in '.git'"),
        ("me/a/b", "is not of the form owner/name"),
    ],
)
def test_repo_names_the_hubs_refuse_are_refused_first(exported, repo_id, expected):
    result = runner.invoke(app, ["publish", str(exported), "--repo-id", repo_id, "--dry-run"])
    assert result.exit_code == 2 and result.output.startswith("error: publish.repo_id: "), result.output
    assert expected in result.output.splitlines()[0], result.output
    assert runner.invoke(app, ["validate", "tiny", f"publish.repo_id={repo_id}"]).exit_code == 2
    assert runner.invoke(app, ["validate", "tiny", "publish.repo_id=Qwen/Qwen3-8B_dspark.v1"]).exit_code == 0


def test_scrub_removes_tokens_and_credential_shapes_only():
    from dspark_cli.publish.hubs import scrub

    assert scrub("401: you sent Authorization: Bearer abc.def-123") == "401: you sent Authorization: Bearer ***"
    assert (
        scrub("GET /x?token=s3cr3t&a=1 and {'api_key': 'abcdefgh12'}") == "GET /x?token=***&a=1 and {'api_key': '***'}"
    )
    assert scrub("hf_" + "a" * 34 + " leaked") == "hf_*** leaked"
    assert scrub("my-own-secret-value here", ("my-own-secret-value",)) == "*** here"
    kept = "serve.num_speculative_tokens: 5 differs from draft.block_size 7; /models/hf_cache/x"
    assert scrub(kept) == kept


# --- hubs that never answer, fail with dumps, redirect, or are left mid-upload --------------------------


def test_a_hub_that_never_answers_is_given_up_on(exported, tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_HTTP_TIMEOUT", "2")
    with LoopbackHub(TOKEN, stall=True) as hub:
        out = publish(str(exported), "--repo-id", REPO, hub=hub, home=tmp_path)  # the helper gives up at 120 s
    assert out.returncode == 1 and "cannot reach Hugging Face" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 2, out.stderr


def test_a_modelscope_500_is_one_line_without_request_dumps(exported, tmp_path):
    with LoopbackModelScope(MS_TOKEN, fail_commits=100) as ms:
        out = publish(
            str(exported), "--repo-id", REPO, "--hub", "modelscope", hub=None, token=None, ms=ms, home=tmp_path
        )
    assert out.returncode == 1 and "500" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 2, out.stderr  # was ~50 lines of request/response dumps
    assert ms.repos[REPO].files == {}


@pytest.mark.parametrize("hub_name", ["huggingface", "modelscope"])
def test_a_redirect_to_another_host_is_refused(exported, tmp_path, hub_name):
    # the files went to the second server while publish printed the first one's URL
    kind, token = (LoopbackHub, TOKEN) if hub_name == "huggingface" else (LoopbackModelScope, MS_TOKEN)
    with kind(token) as elsewhere, kind(token, redirect_to=elsewhere.url) as asked:
        hubs = {"hub": asked} if hub_name == "huggingface" else {"hub": None, "ms": asked}
        out = publish(str(exported), "--repo-id", REPO, "--hub", hub_name, home=tmp_path, **hubs)
    assert out.returncode == 1 and "redirected" in out.stderr and "another host" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 2, out.stderr
    assert elsewhere.requests == [] and elsewhere.repos == {} and asked.repos == {}


def test_a_killed_modelscope_publish_leaves_no_staging_folder_behind(exported, tmp_path):
    import signal
    import time

    draft = copy_of(exported, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODELSCOPE_"))}
    env.update({"HOME": str(tmp_path), "MODELSCOPE_API_TOKEN": MS_TOKEN, "PYTHONWARNINGS": "ignore"})
    with LoopbackModelScope(MS_TOKEN, stall=True) as stalled:
        proc = subprocess.Popen(
            [DSPARK, "publish", str(draft), "--repo-id", REPO, "--hub", "modelscope"],
            env={**env, "MODELSCOPE_ENDPOINT": stalled.url},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while not stalled.requests and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    left = list(draft.parent.glob(".draft.publish-*"))
    assert stalled.requests and len(left) == 1, "the upload had begun, its staging folder beside the draft"
    with LoopbackModelScope(MS_TOKEN) as ms:
        out = publish(str(draft), "--repo-id", REPO, "--hub", "modelscope", hub=None, ms=ms, home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert not list(draft.parent.glob(".draft.publish-*")), "the killed publish's staging folder is still there"


def _profile(draft: Path, tensors: str | None = None) -> dict:
    """An acceptance profile document (bench/profile.py's shape) of the tensors in `draft`, or of `tensors`."""
    from dspark_cli.artifacts.profile import tensors_sha256

    counts = [60, 30, 10, 5, 2, 1, 0, 0][:4]
    positions, given = [], 100
    for i, accepted in enumerate(counts):
        positions.append(
            {"position": i, "accepted": accepted, "steps": 100, "given": given, "marginal": accepted / 100,
             "conditional": accepted / given if given else None}
        )  # fmt: skip
        given = accepted
    return {
        "format": "dspark.speculation_profile",
        "version": 1,
        "draft": {"tensors_sha256": tensors or tensors_sha256(draft / "model.safetensors")},
        "profiles": [{"dataset": "tiny-eval", "temperature": 0.0, "num_steps": 100, "tau": 2.05, "positions": positions,
                      "marginal_accept_rates": [p["marginal"] for p in positions]}],
    }  # fmt: skip


def test_publish_uploads_the_acceptance_profile_and_shows_it_on_the_card(exported, tmp_path):
    draft = copy_of(exported, tmp_path)
    (draft / "speculation_profile.json").write_text(json.dumps(_profile(draft)))
    with LoopbackHub(TOKEN) as hub:
        out = publish(str(draft), "--repo-id", REPO, hub=hub, home=tmp_path)
    assert out.returncode == 0, out.stderr
    files = hub.repos[REPO].files
    assert json.loads(files["speculation_profile.json"]) == _profile(draft)
    card = files["README.md"].decode()
    assert "## Acceptance per draft position" in card
    assert "| tiny-eval | 0 | 100 | 2.05 | 0.60 / 0.60 | 0.30 / 0.50 | 0.10 / 0.33 | 0.05 / 0.50 |" in card
    # a profile of other weights beside the draft is refused by name, before anything is sent
    (draft / "speculation_profile.json").write_text(json.dumps(_profile(draft, tensors="0" * 64)))
    with LoopbackHub(TOKEN) as hub:
        out = publish(str(draft), "--repo-id", REPO, hub=hub, home=tmp_path)
    assert out.returncode == 1 and "speculation_profile.json does not describe these weights" in out.stderr
    assert not hub.repos
