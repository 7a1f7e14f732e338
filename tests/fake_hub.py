"""A local stand-in for the Hugging Face Hub's file endpoint, for download tests.

``huggingface_hub.hf_hub_download`` asks ``HEAD {HF_ENDPOINT}/datasets/{repo}/resolve/{rev}/{file}``
for the commit, ETag and size, then ``GET``s the bytes (with ``Range`` to resume). This server
answers both from a dict, and can cut the connection half-way through a body (what an
``IncompleteRead`` is), so the real client code runs against it with ``HF_ENDPOINT`` set.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class FakeHub:
    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files  # "datasets/{repo}/{filename}" -> bytes
        self.cut = False  # send only half of each body, then close
        self.requests: list[tuple[str, str, str | None]] = []
        self.url = ""


def _handler(hub: FakeHub) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def _lookup(self) -> bytes | None:
            # /datasets/{owner}/{name}/resolve/{revision}/{filename}
            parts = self.path.split("?")[0].strip("/").split("/")
            if len(parts) < 6 or parts[3] != "resolve":
                return None
            return hub.files.get("/".join(parts[:3] + parts[5:]))

        def _headers(self, data: bytes, code: int, length: int) -> None:
            self.send_response(code)
            self.send_header("X-Repo-Commit", "c" * 40)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Content-Length", str(length))
            self.end_headers()

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
            hub.requests.append(("HEAD", self.path, None))
            data = self._lookup()
            if data is None:
                self.send_error(404)
                return
            self._headers(data, 200, len(data))

        def do_GET(self) -> None:  # noqa: N802
            rng = self.headers.get("Range")
            hub.requests.append(("GET", self.path, rng))
            data = self._lookup()
            if data is None:
                self.send_error(404)
                return
            start = int(rng.split("=")[1].split("-")[0]) if rng else 0
            body = data[start:]
            self._headers(data, 206 if rng else 200, len(body))
            if hub.cut:
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextmanager
def serve(files: dict[str, bytes]) -> Iterator[FakeHub]:
    hub = FakeHub(files)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
