"""A tiny HTTP server on 127.0.0.1 that speaks the part of the Hugging Face Hub's API that
huggingface_hub's downloads use, for tests that set HF_ENDPOINT to it (no internet, ever):

    GET  /api/models/{org}/{name}/revision/{rev}     the commit and its files (``siblings``)
    HEAD /{org}/{name}/resolve/{rev}/{path}          ETag, X-Repo-Commit, Content-Length
    GET  /{org}/{name}/resolve/{rev}/{path}          the bytes; ``Range: bytes=N-`` gives a 206

Errors carry the Hub's X-Error-Code header (RepoNotFound, RevisionNotFound, EntryNotFound,
GatedRepo), which huggingface_hub turns into its typed errors. Every request is recorded.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    branches: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> files
    gated_token: str | None = None  # gated: only this token may download


class FakeHub:
    """``with FakeHub() as hub: hub.add("org/name", folder); os.environ["HF_ENDPOINT"] =
    hub.url``. ``faults[path]``: "cut" sends half of that file and drops the connection once;
    "cut-then-fail" then answers 500 to every later request for it."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # (method, path, headers)
        self.faults: dict[str, str] = {}
        self.missing_status = 401  # an unknown repo: 401 without a token, 404 with one
        self._cut: set[str] = set()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._serve(self, body=False)

            def do_GET(self) -> None:
                hub._serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add(self, repo_id: str, files: Path | dict[str, bytes], branch: str = "main",
            gated_token: str | None = None) -> str:
        """A commit of ``files`` (a folder's files, or name -> bytes) on ``branch``; its sha."""
        if isinstance(files, Path):
            files = {p.relative_to(files).as_posix(): p.read_bytes()
                     for p in sorted(files.rglob("*")) if p.is_file()}
        digest = hashlib.sha1(repr(sorted((k, hashlib.sha256(v).hexdigest())
                                          for k, v in files.items())).encode())
        digest.update(branch.encode())
        commit = digest.hexdigest()
        repo = self.repos.setdefault(repo_id, Repo())
        repo.commits[commit] = dict(files)
        repo.branches[branch] = commit
        repo.gated_token = gated_token
        return commit

    def file_requests(self) -> list[str]:
        """The files asked for (HEAD or GET), as repository paths."""
        return [path.split("/resolve/", 1)[1].split("/", 1)[1]
                for _, path, _ in self.requests if "/resolve/" in path]

    def gets(self) -> list[tuple[str, dict[str, str]]]:
        """The files downloaded (GET), with the request headers."""
        return [(path.split("/resolve/", 1)[1].split("/", 1)[1], headers)
                for method, path, headers in self.requests
                if method == "GET" and "/resolve/" in path]

    # ------------------------------------------------------------------ serving

    def _serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        raw = urlsplit(h.path).path  # split first: a revision may hold a quoted "/"
        self.requests.append((h.command, unquote(raw), dict(h.headers)))
        if raw.startswith("/api/models/"):
            repo_id, _, rev = raw[len("/api/models/"):].partition("/revision/")
            return self._info(h, unquote(repo_id), unquote(rev) or "main")
        parts = raw.lstrip("/").split("/", 4)
        if len(parts) == 5 and parts[2] == "resolve":
            return self._file(h, f"{parts[0]}/{parts[1]}", unquote(parts[3]), unquote(parts[4]),
                              body)
        return self._error(h, 404, "", body)

    def _commit(self, h, repo_id: str, rev: str, body: bool) -> tuple[Repo, str] | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, self.missing_status, "RepoNotFound", body)
            return None
        commit = repo.branches.get(rev, rev if rev in repo.commits else None)
        if commit is None:
            self._error(h, 404, "RevisionNotFound", body)
            return None
        return repo, commit

    def _info(self, h, repo_id: str, rev: str) -> None:
        found = self._commit(h, repo_id, rev, True)
        if found is None:
            return
        repo, commit = found
        data = {"id": repo_id, "sha": commit, "private": False,
                "gated": "manual" if repo.gated_token else False,
                "siblings": [{"rfilename": name, "size": len(content)}
                             for name, content in sorted(repo.commits[commit].items())]}
        self._send(h, 200, json.dumps(data).encode(), {"Content-Type": "application/json"})

    def _file(self, h, repo_id: str, rev: str, name: str, body: bool) -> None:
        found = self._commit(h, repo_id, rev, body)
        if found is None:
            return
        repo, commit = found
        if repo.gated_token and h.headers.get("authorization") != f"Bearer {repo.gated_token}":
            status = 403 if h.headers.get("authorization") else 401
            return self._error(h, status, "GatedRepo", body, commit)
        content = repo.commits[commit].get(name)
        if content is None:
            return self._error(h, 404, "EntryNotFound", body, commit)
        headers = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes",
                   "ETag": f'"{hashlib.sha256(content).hexdigest()}"',
                   "Content-Type": "application/octet-stream"}
        fault = self.faults.get(name)
        if body and name in self._cut and fault == "cut-then-fail":
            return self._error(h, 500, "", body, commit)
        start = 0
        rng = h.headers.get("Range")
        if body and rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[len("bytes="):-1])
            headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
        part = content[start:]
        if not body:
            return self._send(h, 200, b"", headers, length=len(content))
        if fault and name not in self._cut:  # half the bytes, then the connection drops
            self._cut.add(name)
            h.send_response(206 if start else 200)
            for k, v in {**headers, "Content-Length": str(len(part))}.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(part[:len(part) // 2])
            h.wfile.flush()
            h.close_connection = True
            return
        self._send(h, 206 if start else 200, part, headers)

    def _error(self, h, status: int, code: str, body: bool, commit: str | None = None) -> None:
        headers = {"X-Error-Code": code} if code else {}
        if commit:
            headers["X-Repo-Commit"] = commit
        message = json.dumps({"error": code or "error"}).encode()
        self._send(h, status, message if body else b"", headers, length=len(message))

    @staticmethod
    def _send(h, status: int, content: bytes, headers: dict[str, str],
              length: int | None = None) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(content) if length is None else length))
        h.end_headers()
        if content:
            h.wfile.write(content)
