"""Every HTTP exchange dspark starts with the standard library (bench's endpoints, datagen's endpoint, the
vLLM probes): how long it waits, how much it reads.

    from dspark_cli.network import MAX_JSON_BYTES, Timeouts, exchange, read_limited
    with exchange(url, Timeouts.from_env(), waiting_for="the model list") as (response, deadline):
        body = read_limited(response, MAX_JSON_BYTES, url)

An exchange has two clocks. `read_s` bounds any one wait for the next bytes (`DSPARK_HTTP_TIMEOUT`,
default 300 s): a server that accepts the connection and says nothing is given up on then.
`request_s` bounds the whole exchange, from connecting to the last byte (`DSPARK_HTTP_REQUEST_TIMEOUT`,
default 1800 s): a server that keeps the connection alive with SSE keep-alives, or trickles a token at
a time and never ends, is cut there. Both are enforced below http.client, on every read of the socket
(status line, headers, chunk framing, body): the deadline is checked before each read and the socket's
timeout is set to min(read_s, what is left), so no sequence of reads can outlast it. A stalled
exchange ends in `Stalled`, one line naming the address, what dspark was waiting for and what the
server had done, with a hint naming the setting that bounds it. The hub clients (huggingface_hub,
ModelScope's) get the same bounds in `dspark_cli/publish/hubhttp.py`.

An answer is read only up to its bound (`MAX_JSON_BYTES` for an API reply, `MAX_STREAM_BYTES` for
one streamed completion), and one that announces more in its Content-Length is refused before a
byte of the body is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import io
import os
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dspark_cli.errors import DataError, DsparkError

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_REQUEST_TIMEOUT_S = 1800.0
CONNECT_TIMEOUT_S = 10.0
MAX_JSON_BYTES = 16 * 2**20  # /v1/models, a hub's JSON reply, vLLM's /metrics
MAX_STREAM_BYTES = 64 * 2**20  # one streamed chat completion, every chunk together
MAX_LINE_BYTES = 2**20  # one server-sent-events line


def _seconds_from_env(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if 0 < value < float("inf") else default


def timeout_s() -> float:
    """Seconds of silence after which a server is given up on (DSPARK_HTTP_TIMEOUT, else 300)."""
    return _seconds_from_env("DSPARK_HTTP_TIMEOUT", DEFAULT_TIMEOUT_S)


def request_timeout_s() -> float:
    """Seconds one whole exchange may take, connecting to the last byte (DSPARK_HTTP_REQUEST_TIMEOUT, else 1800)."""
    return _seconds_from_env("DSPARK_HTTP_REQUEST_TIMEOUT", DEFAULT_REQUEST_TIMEOUT_S)


@dataclass(frozen=True)
class Timeouts:
    """How long one exchange may take (`request_s`, in all) and wait (`read_s`, for any one read), and the
    settings a user changes them with (named in the hint of a `Stalled`)."""

    request_s: float
    read_s: float
    request_setting: str = "DSPARK_HTTP_REQUEST_TIMEOUT"
    read_setting: str = "DSPARK_HTTP_TIMEOUT"

    @classmethod
    def from_env(cls, request_s: float | None = None, read_s: float | None = None, **settings: str) -> Timeouts:
        """`request_s` / `read_s` where given (a recipe key), else the environment's, else the defaults."""
        return cls(request_s or request_timeout_s(), read_s or timeout_s(), **settings)


class Stalled(DsparkError):
    """A server that did not finish an exchange in time (exit 1): the address, what dspark was waiting for,
    what the server had done; the hint names the setting that bounds the wait."""


class Deadline:
    """The clock of one exchange. `note` is what the server has done so far, in words, for the error line
    (a caller that reads a stream says it: "it kept the connection open with keep-alives"); without one,
    the line says whether the server connected and how many bytes it sent."""

    def __init__(self, url: str, timeouts: Timeouts, waiting_for: str) -> None:
        self.url, self.timeouts, self.waiting_for = url, timeouts, waiting_for
        self.end = time.monotonic() + timeouts.request_s
        self.connected = False
        self.received = 0
        self.note = ""

    def wait_s(self) -> float:
        """The bound on the next wait: `read_s` or what is left of `request_s`; `Stalled` when nothing is."""
        left = self.end - time.monotonic()
        if left <= 0:
            raise self.stalled(whole=True)
        return min(self.timeouts.read_s, left)

    def extend(self, seconds: float) -> None:
        """`seconds` more for the whole exchange (a transfer, once its size is known)."""
        self.end += seconds
        self.timeouts = dataclasses.replace(self.timeouts, request_s=self.timeouts.request_s + seconds)

    def timed_out(self, waited: float) -> Stalled:
        """The error for a wait of `waited` s that ran out: the whole exchange's if that was all that was left."""
        return self.stalled(whole=waited < self.timeouts.read_s)

    def stalled(self, *, whole: bool) -> Stalled:
        if self.note:
            done = self.note
        elif not self.connected:
            done = "no connection"
        elif not self.received:
            done = "it accepted the connection and sent nothing"
        else:
            done = f"{self.received:,} bytes received, then nothing"
        t = self.timeouts
        if whole:
            message = f"{self.url}: no {self.waiting_for} within {t.request_s:g} s of sending the request ({done})"
            setting, now = t.request_setting, t.request_s
        else:
            message = f"{self.url}: silent for {t.read_s:g} s, no {self.waiting_for} yet ({done})"
            setting, now = t.read_setting, t.read_s
        return Stalled(message, f"if the server is only slow, raise {setting} (now {now:g} s); else check the server")


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes, each read bounded by the exchange's deadline (http.client reads through this)."""

    def __init__(self, sock: socket.socket, deadline: Deadline) -> None:
        super().__init__()
        self._sock, self._raw, self._deadline = sock, sock.makefile("rb", buffering=0), deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        wait = self._deadline.wait_s()
        self._sock.settimeout(wait)
        try:
            count = self._raw.readinto(buffer)
        except TimeoutError:
            raise self._deadline.timed_out(wait) from None
        self._deadline.received += count or 0
        return count

    def close(self) -> None:
        self._raw.close()
        super().close()


class _SocketView:
    """What http.client's response sees as its socket: `makefile` hands out the deadline-bound reader."""

    def __init__(self, sock: socket.socket, deadline: Deadline) -> None:
        self._sock, self._deadline = sock, deadline

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))


def deadline_response(sock: socket.socket, deadline: Deadline, *args: Any, **kwargs: Any) -> http.client.HTTPResponse:
    """http.client's response to read from `sock` (a connection's `response_class`), every read under `deadline`."""
    return http.client.HTTPResponse(_SocketView(sock, deadline), *args, **kwargs)  # type: ignore[arg-type]


class _BoundConnection:
    """Mixed into http.client's connections: the response reads through the deadline, connecting is noted."""

    deadline: Deadline

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]  # http.client's connect, through the MRO
        self.deadline.connected = True

    def response_class(self, sock: socket.socket, *args: Any, **kwargs: Any) -> http.client.HTTPResponse:
        return deadline_response(sock, self.deadline, *args, **kwargs)


class _HTTPConnection(_BoundConnection, http.client.HTTPConnection):  # type: ignore[misc]  # response_class: a factory
    def __init__(self, *args: Any, deadline: Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline


class _HTTPSConnection(_BoundConnection, http.client.HTTPSConnection):  # type: ignore[misc]  # as above
    def __init__(self, *args: Any, deadline: Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPConnection, req, deadline=self.deadline)  # type: ignore[arg-type]


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        context = ssl.create_default_context()
        return self.do_open(_HTTPSConnection, req, context=context, deadline=self.deadline)  # type: ignore[arg-type]


@contextlib.contextmanager
def exchange(
    request: str | urllib.request.Request, timeouts: Timeouts, *, waiting_for: str = "answer", direct: bool = False
) -> Iterator[tuple[Any, Deadline]]:
    """`urllib.request.urlopen(request)` under `timeouts`: yields the response (read it as urlopen's) and
    its `Deadline` (set `deadline.note` while reading a stream). A stalled server raises `Stalled`; an
    HTTP error status, a refused connection and the like raise as they do from urlopen. `direct`: ignore
    the environment's http_proxy (a cluster-internal address, such as a Mooncake master's admin port)."""
    url = request if isinstance(request, str) else request.full_url
    deadline = Deadline(url, timeouts, waiting_for)
    handlers: list[urllib.request.BaseHandler] = [_HTTPHandler(deadline), _HTTPSHandler(deadline)]
    if direct:
        handlers.append(urllib.request.ProxyHandler({}))
    opener = urllib.request.build_opener(*handlers)
    wait = deadline.wait_s()
    try:
        response = opener.open(request, timeout=wait)
    except urllib.error.URLError as exc:  # connecting (or sending) ran out of time: urllib wraps the timeout
        if isinstance(exc.reason, TimeoutError):
            raise deadline.timed_out(wait) from None
        raise
    with response:
        yield response, deadline


def too_large(length: str | None, limit: int) -> bool:
    """Does a Content-Length header announce more than `limit` bytes?"""
    return bool(length and length.strip().isdigit() and int(length) > limit)


def read_limited(response: Any, limit: int, what: str) -> bytes:
    """The body of a urllib `response`, at most `limit` bytes; a one-line DataError naming `what` if it is
    announced (Content-Length) or turns out longer."""
    length = response.headers.get("Content-Length")
    if too_large(length, limit):
        raise DataError(
            f"{what}: the server announces {int(length):,} bytes, more than the {limit:,} dspark reads",
            "is this the server you meant?",
        )
    data = response.read(limit + 1)
    if len(data) > limit:
        raise DataError(
            f"{what}: the answer is longer than the {limit:,} bytes dspark reads", "is this the server you meant?"
        )
    return data
