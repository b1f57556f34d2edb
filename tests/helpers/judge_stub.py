"""A small OpenAI-compatible stub judge for tests: an ``http.server`` on 127.0.0.1 (a free port,
loopback only) that answers each POST with ``reply(body) -> (status, content)``."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = Callable[[dict[str, Any]], tuple[int, Any]]


def chat_answer(content: str) -> dict[str, Any]:
    """A ``/chat/completions`` response body with one choice."""
    return {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
    }


class StubJudge:
    """``reply(body)`` returns ``(status, payload)``: a str payload becomes a chat answer with that
    content (status 200) or an error body; a dict is sent as it is. Every request body is kept in
    :attr:`requests` (with its path); :attr:`max_in_flight` is the most requests handled at once."""

    def __init__(self, reply: Reply) -> None:
        self.requests: list[dict[str, Any]] = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub._lock:
                    stub.requests.append({"path": self.path, **body})
                    stub.in_flight += 1
                    stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
                try:
                    status, payload = reply(body)
                finally:
                    with stub._lock:
                        stub.in_flight -= 1
                if isinstance(payload, str):
                    payload = chat_answer(payload) if status == 200 else {"error": {"message": payload}}
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout) and closed the connection
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # socketserver's default backlog (5) drops concurrent connects: 1 s SYN retry

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def user_text(body: dict[str, Any]) -> str:
    """The filled-in template of a chat request (the last message) or a completions request."""
    return body["messages"][-1]["content"] if "messages" in body else body["prompt"]
