"""A Hugging Face Hub of one model repository on 127.0.0.1, for tests/test_export.py: the
routes huggingface_hub's ``snapshot_download`` takes (the repository's revision, its file
tree, and each file's metadata and bytes), so that a Hub id is downloaded by the real client
code, over HTTP, with nothing leaving the machine. Every request is recorded.

    with HubServer("org/name", {"config.json": b"...", ...}) as hub:
        env["HF_ENDPOINT"] = hub.endpoint
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


class HubServer:
    def __init__(self, repo_id: str, files: dict[str, bytes]) -> None:
        self.repo_id, self.files = repo_id, dict(files)
        self.commit = hashlib.sha1(b"".join(hashlib.sha256(files[name]).digest() for name in sorted(files))).hexdigest()
        self.requests: list[tuple[str, str]] = []  # (method, path), in order
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet: the test reads self.requests
                pass

            def do_GET(self) -> None:
                hub._answer(self, body=True)

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def fetched(self) -> set[str]:
        """The names of the files whose bytes were asked for."""
        prefix = f"/{self.repo_id}/resolve/{self.commit}/"
        return {unquote(path)[len(prefix):] for method, path in self.requests if method == "GET"
                and unquote(path).startswith(prefix)}

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def _answer(self, request: BaseHTTPRequestHandler, body: bool) -> None:
        self.requests.append((request.command, request.path))
        path = unquote(urlparse(request.path).path)
        api = f"/api/models/{self.repo_id}"
        resolve = f"/{self.repo_id}/resolve/"
        if path in (f"{api}/revision/main", f"{api}/revision/{self.commit}"):
            info = {"id": self.repo_id, "sha": self.commit, "siblings": [{"rfilename": name} for name in self.files]}
            return self._send(request, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
        if path == f"{api}/tree/{self.commit}":
            tree = [{"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for name, data in self.files.items()]
            return self._send(request, 200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, body)
        if path.startswith(resolve):
            revision, _, name = path[len(resolve):].partition("/")
            if revision in ("main", self.commit) and name in self.files:
                data = self.files[name]
                return self._send(request, 200, data, {"X-Repo-Commit": self.commit,
                                                       "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}, body)
        # As the Hub answers a repository or file it does not have.
        self._send(request, 404, b'{"error": "Repository not found"}',
                   {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound"}, body)

    @staticmethod
    def _send(request: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        request.send_response(status)
        for name, value in headers.items():
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        if body:
            request.wfile.write(data)
