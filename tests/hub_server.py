"""A loopback Hugging Face Hub: the HTTP endpoints `huggingface_hub` uses to create a repo, commit files, and
download a snapshot.

    with LoopbackHub(token="hf_test") as hub:        # hub.url -> http://127.0.0.1:PORT
        ... HF_ENDPOINT=hub.url HF_TOKEN=hf_test HF_HUB_DISABLE_XET=1 dspark publish ...
        hub.repos["me/draft"].files["model.safetensors"]   # the bytes that arrived
        hub.repos["org/name"] = Repo(private=False, files={"config.json": b"..."})   # to download

Implemented from the client's side of the protocol (huggingface_hub's `create_repo` and
`create_commit`): POST /api/repos/create, POST /api/models/{repo}/preupload/{rev}, the git-LFS
batch API (POST /{repo}.git/info/lfs/objects/batch, then a PUT of each object to the URL it
returns), POST /api/validate-yaml (the model card's front matter), and
POST /api/models/{repo}/commit/{rev} with its NDJSON body. Xet storage is not
emulated: clients must set HF_HUB_DISABLE_XET=1, which makes huggingface_hub use plain LFS. Every
request must carry `Authorization: Bearer <token>`; objects are checked against their sha256.
A commit is applied all at once or not at all, as on the Hub.

Downloads, as huggingface_hub 2.x's `snapshot_download` makes them (`hf_api.repo_info`,
`list_repo_tree`, `file_download.get_hf_file_metadata`): GET /api/models/{repo}/revision/{rev}
(`sha`, `siblings`), GET /api/models/{repo}/tree/{rev} (each file's `oid`, `size`, and `lfs` for the
LFS-stored ones), and HEAD / GET /{repo}/resolve/{rev}/{file} with `X-Repo-Commit`, an `ETag` (the git
blob sha1; for LFS files `X-Linked-Etag`, the sha256, and `X-Linked-Size`) and `Content-Length`. A
public repo is read without a token, a private one needs it; an unknown repo or file answers 404 with
the `X-Error-Code` the client maps to RepositoryNotFoundError / EntryNotFoundError. Every GET and
HEAD is in `requests`, so a test sees which files were downloaded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import yaml

LFS_SUFFIXES = (".safetensors", ".png", ".bin")


@dataclass
class Repo:
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[str] = field(default_factory=list)  # commit messages, oldest first

    def sha(self) -> str:
        """The commit id of the repo's current files (40 hex digits, as the Hub's)."""
        digest = hashlib.sha1()
        for name, data in sorted(self.files.items()):
            digest.update(name.encode() + b"\0" + hashlib.sha1(data).digest())
        return digest.hexdigest()


def _tree_entry(name: str, data: bytes) -> dict[str, Any]:
    """A file as the Hub's tree API lists it: `oid` is the git blob sha1; LFS-stored files add `lfs`."""
    oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    entry: dict[str, Any] = {"type": "file", "path": name, "size": len(data), "oid": oid}
    if name.endswith(LFS_SUFFIXES):
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
    return entry


def _tree(repo: Repo, under: str, recursive: bool) -> list[dict[str, Any]]:
    """The tree API's listing of folder `under` ("" for the root): its files, and its folders as `directory`
    entries (every file below, with the folders on the way, when `recursive`)."""
    prefix = f"{under}/" if under else ""
    entries: dict[str, dict[str, Any]] = {}
    for name, data in sorted(repo.files.items()):
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix) :].split("/")
        for depth in range(1, len(rest)):  # the folders between `under` and the file
            folder = prefix + "/".join(rest[:depth])
            entries.setdefault(folder, {"type": "directory", "path": folder, "oid": "0" * 40, "size": 0})
            if not recursive:
                break
        if len(rest) == 1 or recursive:
            entries[name] = _tree_entry(name, data)
    return [entries[key] for key in sorted(entries)]


class JSONHandler(BaseHTTPRequestHandler):
    """Request plumbing both loopback hubs share: a quiet log, the request body, a JSON reply, the bearer
    token check (the refusal is each protocol's own `_deny`). `self.server.hub` is the LoopbackServer."""

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _reply(self, status: int, obj: Any) -> None:
        payload = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _deny(self) -> None:
        """Reply 401 in the protocol's own error format."""
        raise NotImplementedError

    def _echo(self, message: str) -> str:
        """`message`, plus the Authorization header it was sent with when the hub echoes it."""
        if not self.server.hub.echo_auth:
            return message
        return f"{message} (request had Authorization: {self.headers.get('Authorization')})"

    def _detoured(self) -> bool:
        """A misbehaving hub: `stall` accepts the request and never answers; `redirect_to` answers every
        request with a 307 to the same path on another server. True when the request was handled so."""
        hub = self.server.hub
        if hub.stall:
            time.sleep(3600)
            return True
        if hub.redirect_to:
            self._body()
            self.send_response(307)
            self.send_header("Location", hub.redirect_to + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True
        return False

    def _authorised(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {self.server.hub.token}":
            return True
        self._body()
        self._deny()
        return False


class LoopbackServer:
    """A hub's state (repos, LFS objects by sha256, the request log) behind a threaded HTTP server on a free
    loopback port; a subclass's `_handler()` returns the request handler class that speaks its protocol."""

    def __init__(
        self, token: str, *, echo_auth: bool = False, stall: bool = False, redirect_to: str | None = None
    ) -> None:
        self.token = token
        self.echo_auth = echo_auth  # a careless server: every error body repeats the request's Authorization header
        self.stall, self.redirect_to = stall, redirect_to  # see JSONHandler._detoured
        self.repos: dict[str, Repo] = {}
        self.objects: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.hub = self  # the handlers' way back to this state
        self._server.daemon_threads = True  # a stalled handler does not hold up shutdown
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[JSONHandler]:
        raise NotImplementedError

    def store_object(self, oid: str, data: bytes) -> bool:
        """Keep an uploaded LFS object under its sha256; False (nothing kept) when `oid` is not its sha256."""
        if hashlib.sha256(data).hexdigest() != oid:
            return False
        with self._lock:
            self.objects[oid] = data
        return True


class LoopbackHub(LoopbackServer):
    def __init__(self, token: str, *, fail_commits: int = 0, **behaviour: Any) -> None:
        self.card_metadata: list[dict[str, Any]] = []  # every model card front matter validated
        self.datasets: dict[str, Repo] = {}  # dataset repos to download (`datasets.load_dataset`), by repo id
        self.fail_commits = fail_commits  # answer the next N commits with HTTP 500
        super().__init__(token, **behaviour)

    def _handler(self) -> type[JSONHandler]:
        hub = self

        class Handler(JSONHandler):
            def _send(self, status: int, data: Any = None) -> None:
                data = data if data is not None else {}
                if status >= 400 and "error" in data:
                    data["error"] = self._echo(data["error"])
                self._reply(status, data)

            def _deny(self) -> None:
                self._send(401, {"error": "Invalid credentials in Authorization header"})

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._download(head=False)

            def do_HEAD(self) -> None:  # noqa: N802
                self._download(head=True)

            def _download(self, head: bool) -> None:
                hub.requests.append(("HEAD" if head else "GET", self.path))
                if self._detoured():
                    return None
                path = self.path.split("?", 1)[0]
                if path.startswith(("/api/datasets/", "/datasets/")):
                    return self._dataset(path, head)
                parts = path.split("/")
                if path.startswith("/api/models/") and len(parts) >= 7 and parts[5] in ("revision", "tree"):
                    repo = self._readable(f"{parts[3]}/{parts[4]}", head)
                    if repo is None:
                        return None
                    if parts[5] == "revision":
                        return self._revision(repo, f"{parts[3]}/{parts[4]}")
                    return self._reply(200, [_tree_entry(name, data) for name, data in sorted(repo.files.items())])
                if len(parts) >= 6 and parts[3] == "resolve":
                    repo = self._readable(f"{parts[1]}/{parts[2]}", head)
                    if repo is None:
                        return None
                    return self._resolved(repo, "/".join(parts[5:]), head)
                return self._missing(head, None, f"no route for {path}")

            def _dataset(self, path: str, head: bool) -> None:
                """A dataset repo: /api/datasets/{repo}/revision/{rev} (`sha`, `siblings`), .../tree/{rev}[/{dir}]
                (the files under dir, `recursive` or not) and /datasets/{repo}/resolve/{rev}/{file}."""
                parts = path.split("/")
                if parts[1] == "api" and len(parts) >= 7 and parts[5] in ("revision", "tree"):
                    repo = self._readable(f"{parts[3]}/{parts[4]}", head, hub.datasets)
                    if repo is None:
                        return None
                    if parts[5] == "revision":
                        return self._revision(repo, f"{parts[3]}/{parts[4]}")
                    under = "/".join(p for p in parts[7:] if p)
                    return self._reply(200, _tree(repo, under, "recursive=true" in self.path.lower()))
                if parts[1] == "datasets" and len(parts) >= 7 and parts[4] == "resolve":
                    repo = self._readable(f"{parts[2]}/{parts[3]}", head, hub.datasets)
                    if repo is None:
                        return None
                    return self._resolved(repo, "/".join(parts[6:]), head)
                return self._missing(head, None, f"no route for {path}")

            def _revision(self, repo: Repo, repo_id: str) -> None:
                """A repo's revision info (model or dataset): its id, sha and files."""
                siblings = [{"rfilename": name} for name in sorted(repo.files)]
                return self._send(200, {"id": repo_id, "sha": repo.sha(), "siblings": siblings})

            def _resolved(self, repo: Repo, name: str, head: bool) -> None:
                """One file of a repo (model or dataset), or EntryNotFound."""
                if name not in repo.files:
                    return self._missing(head, "EntryNotFound", f"{name} not found")
                return self._file(repo, name, head)

            def _readable(self, repo_id: str, head: bool, repos: dict[str, Repo] | None = None) -> Repo | None:
                """The repo, if it exists and this request may read it (else the reply is sent)."""
                repo = (hub.repos if repos is None else repos).get(repo_id)
                authorised = self.headers.get("Authorization") == f"Bearer {hub.token}"
                if repo is None or (repo.private and not authorised):  # the Hub hides private repos
                    self._missing(head, "RepoNotFound", "Repository not found")
                    return None
                return repo

            def _missing(self, head: bool, code: str | None, message: str) -> None:
                payload = b"" if head else json.dumps({"error": message}).encode()
                self.send_response(404)
                if code:
                    self.send_header("X-Error-Code", code)
                    self.send_header("X-Error-Message", message)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _file(self, repo: Repo, name: str, head: bool) -> None:
                data = repo.files[name]
                entry = _tree_entry(name, data)
                self.send_response(200)
                self.send_header("X-Repo-Commit", repo.sha())
                self.send_header("ETag", f'"{entry["oid"]}"')
                if "lfs" in entry:
                    self.send_header("X-Linked-Etag", f'"{entry["lfs"]["oid"]}"')
                    self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)

            def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
                hub.requests.append(("PUT", self.path))
                if self._detoured():
                    return None
                if not self.path.startswith("/lfs-upload/"):
                    return self._send(404, {"error": "not found"})
                if not hub.store_object(self.path.rsplit("/", 1)[-1], self._body()):
                    return self._send(400, {"error": "sha256 mismatch"})
                return self._send(200)

            def do_POST(self) -> None:  # noqa: N802
                hub.requests.append(("POST", self.path))
                if self._detoured() or not self._authorised():
                    return None
                path = self.path.split("?", 1)[0]
                if path == "/api/repos/create":
                    return self._create(json.loads(self._body()))
                if path == "/api/validate-yaml":
                    return self._validate_yaml(json.loads(self._body())["content"])
                if path.endswith(".git/info/lfs/objects/batch"):
                    return self._lfs_batch(json.loads(self._body()))
                parts = path.split("/")
                if path.startswith("/api/models/") and len(parts) >= 7 and parts[5] in ("preupload", "commit"):
                    repo_id = f"{parts[3]}/{parts[4]}"
                    if repo_id not in hub.repos:
                        self._body()
                        return self._send(404, {"error": "Repository not found"})
                    if parts[5] == "preupload":
                        return self._preupload(json.loads(self._body()))
                    return self._commit(repo_id, self._body())
                self._body()
                return self._send(404, {"error": f"no route for {path}"})

            def _create(self, payload: dict[str, Any]) -> None:
                repo_id = f"{payload['organization']}/{payload['name']}"
                with hub._lock:
                    if repo_id in hub.repos:
                        return self._send(
                            409, {"error": "You already created this model repo", "url": f"{hub.url}/{repo_id}"}
                        )
                    visibility = payload.get("visibility") or ("private" if payload.get("private") else "public")
                    hub.repos[repo_id] = Repo(private=visibility == "private")
                return self._send(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id})

            def _validate_yaml(self, content: str) -> None:
                """The model card's front matter must be a YAML mapping (the Hub checks its fields further)."""
                if not content.startswith("---\n") or "\n---\n" not in content[4:]:
                    return self._send(400, {"errors": [{"message": "no YAML front matter"}]})
                try:
                    meta = yaml.safe_load(content[4:].split("\n---\n", 1)[0])
                except yaml.YAMLError as exc:
                    return self._send(400, {"errors": [{"message": f"invalid YAML: {exc}"}]})
                if not isinstance(meta, dict):
                    return self._send(400, {"errors": [{"message": "front matter is not a mapping"}]})
                hub.card_metadata.append(meta)
                return self._send(200, {"warnings": []})

            def _preupload(self, payload: dict[str, Any]) -> None:
                files = [
                    {
                        "path": f["path"],
                        "uploadMode": "lfs" if f["path"].endswith(LFS_SUFFIXES) else "regular",
                        "shouldIgnore": False,
                        "oid": None,
                    }
                    for f in payload["files"]
                ]
                return self._send(200, {"files": files, "commitOid": "0" * 40})

            def _lfs_batch(self, payload: dict[str, Any]) -> None:
                objects = [
                    {
                        "oid": o["oid"],
                        "size": o["size"],
                        "authenticated": True,
                        "actions": {"upload": {"href": f"{hub.url}/lfs-upload/{o['oid']}"}},
                    }
                    for o in payload["objects"]
                    if o["oid"] not in hub.objects
                ]
                return self._send(200, {"transfer": "basic", "objects": objects})

            def _commit(self, repo_id: str, body: bytes) -> None:
                with hub._lock:
                    if hub.fail_commits > 0:
                        hub.fail_commits -= 1
                        return self._send(500, {"error": "commit failed (injected)"})
                    staged: dict[str, bytes] = {}
                    message = ""
                    for line in body.splitlines():
                        item = json.loads(line)
                        value = item["value"]
                        if item["key"] == "header":
                            message = value["summary"]
                        elif item["key"] == "file":
                            staged[value["path"]] = base64.b64decode(value["content"])
                        elif item["key"] == "lfsFile":
                            if value["oid"] not in hub.objects:
                                return self._send(422, {"error": f"LFS object {value['oid']} was never uploaded"})
                            staged[value["path"]] = hub.objects[value["oid"]]
                        else:
                            return self._send(400, {"error": f"unsupported commit item {item['key']}"})
                    repo = hub.repos[repo_id]
                    repo.files.update(staged)
                    repo.commits.append(message)
                    oid = hashlib.sha1(body).hexdigest()
                return self._send(
                    200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}
                )

        return Handler


class LoopbackModelScope(LoopbackServer):
    """A loopback ModelScope: the `/api/v1` endpoints modelscope's HubApi uses to create a model repo and
    commit files, implemented from the client's side (modelscope_hub 0.5 `_legacy_api.py`).

        with LoopbackModelScope(token="ms_test") as hub:   # MODELSCOPE_ENDPOINT=hub.url MODELSCOPE_API_TOKEN=ms_test
            hub.repos["me/draft"].files["model.safetensors"]

    POST /api/v1/models creates (`Visibility` 1 private, 5 public; an existing repo answers the
    "already exists" business code), POST /api/v1/repos/models/{repo}/info/lfs/objects/batch returns
    upload URLs for blobs it lacks (PUT, checked against sha256), and
    POST /api/v1/repos/models/{repo}/commit/{rev} applies `normal` (base64) and `lfs` (sha256)
    actions all at once. Responses use ModelScope's envelope {"Code", "Success", "Data", "Message"}.
    Every request must carry `Authorization: Bearer <token>`.
    """

    def __init__(self, token: str, *, fail_commits: int = 0, **behaviour: Any) -> None:
        self.fail_commits = fail_commits  # answer the next N commits with HTTP 500
        super().__init__(token, **behaviour)

    def _handler(self) -> type[JSONHandler]:
        hub = self

        class Handler(JSONHandler):
            def _send(self, status: int, code: int = 200, data: Any = None, message: str = "ok") -> None:
                message = self._echo(message) if status >= 400 else message
                self._reply(
                    status,
                    {
                        "Code": code,
                        "Success": code == 200,
                        "Data": data if data is not None else {},
                        "Message": message,
                        "RequestId": "loopback",
                    },
                )

            def _deny(self) -> None:
                self._send(401, 401, message="token is invalid or expired")

            def do_PUT(self) -> None:  # noqa: N802
                hub.requests.append(("PUT", self.path))
                if self._detoured() or not self._authorised():
                    return None
                data = self._body()
                if not self.path.startswith("/lfs-put/") or not hub.store_object(self.path.rsplit("/", 1)[-1], data):
                    return self._send(400, 400, message="bad blob")
                return self._send(200)

            def do_POST(self) -> None:  # noqa: N802
                hub.requests.append(("POST", self.path))
                if self._detoured() or not self._authorised():
                    return None
                path = self.path.split("?", 1)[0]
                body = json.loads(self._body() or b"{}")
                if path == "/api/v1/models":
                    return self._create(body)
                parts = path.split("/")  # ['', 'api', 'v1', 'repos', 'models', owner, name, ...]
                if path.startswith("/api/v1/repos/models/") and len(parts) >= 9:
                    repo_id = f"{parts[5]}/{parts[6]}"
                    if repo_id not in hub.repos:
                        return self._send(404, 404, message=f"model {repo_id} not found")
                    if parts[7:] == ["info", "lfs", "objects", "batch"]:
                        objects = [
                            {
                                "oid": o["oid"],
                                "size": o["size"],
                                "actions": {"upload": {"href": f"{hub.url}/lfs-put/{o['oid']}"}},
                            }
                            for o in body["objects"]
                            if o["oid"] not in hub.objects
                        ]
                        return self._send(200, data={"objects": objects})
                    if parts[7] == "commit":
                        return self._commit(repo_id, body)
                return self._send(404, 404, message=f"no route for {path}")

            def _create(self, body: dict[str, Any]) -> None:
                repo_id = f"{body['Path']}/{body['Name']}"
                with hub._lock:
                    if repo_id in hub.repos:
                        return self._send(400, 10010101001, message="model already exists")
                    hub.repos[repo_id] = Repo(private=int(body.get("Visibility", 5)) == 1)
                return self._send(200, data={"Path": body["Path"], "Name": body["Name"]})

            def _commit(self, repo_id: str, body: dict[str, Any]) -> None:
                staged: dict[str, bytes] = {}
                with hub._lock:
                    if hub.fail_commits > 0:
                        hub.fail_commits -= 1
                        return self._send(500, 500, message="commit failed (injected)")
                    for action in body["actions"]:
                        if action["action"] not in ("create", "update"):
                            return self._send(400, 400, message=f"unsupported action {action['action']}")
                        if action["type"] == "lfs":
                            if action["sha256"] not in hub.objects:
                                return self._send(400, 400, message=f"blob {action['sha256']} was never uploaded")
                            staged[action["path"]] = hub.objects[action["sha256"]]
                        else:
                            staged[action["path"]] = base64.b64decode(action["content"])
                    repo = hub.repos[repo_id]
                    repo.files.update(staged)
                    repo.commits.append(body["commit_message"])
                return self._send(200, data={"CommitId": hashlib.sha1(json.dumps(body).encode()).hexdigest()})

        return Handler
