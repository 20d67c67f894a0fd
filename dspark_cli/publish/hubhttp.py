"""The hub clients' HTTP (huggingface_hub's httpx client, ModelScope's `requests` sessions) under dspark's bounds.

    from dspark_cli.publish.hubhttp import requests_bounded, use_for_hubs
    use_for_hubs()                  # huggingface_hub's shared client, and ModelScope's timeouts
    with requests_bounded():        # around ModelScope's client calls
        api.upload_folder(...)

Each request: connecting waits at most `CONNECT_TIMEOUT_S`, any one read or write `DSPARK_HTTP_TIMEOUT`
(default 300 s), and the whole exchange `DSPARK_HTTP_REQUEST_TIMEOUT` (default 1800 s) plus one second
per `MIN_TRANSFER_RATE` bytes it sends or is announced to receive. A JSON API call (create a repo,
preupload, commit) so gets the request deadline alone; a file transfer (an LFS upload of the weights)
gets time for its bytes at a slow line's pace on top, so a large upload on a slow line is not cut while
one that stalls or crawls is.

How the deadline is held differs with the client. ModelScope's (requests, over http.client): every read
of the answer goes through `dspark_cli/network.py`'s deadline-bound reader, as the standard library's
exchanges do; the sending of an upload is bounded per write by the client's own timeouts. huggingface_hub's
(httpx): the transport reads its timeout once per request, so every wait is bounded by min(per-read, what
was left when the request was sent) and the deadline is checked between the chunks of the body sent and of
the answer received: a server that trickles forever is cut at most one wait past the deadline. A cut is a
`Stalled` (`stalled_cause` finds it in what the client raised); a client's own retries each get a deadline
of their own (huggingface_hub does not retry a cut; ModelScope's client may, as it retries a timeout).

A redirect that leaves the host asked is refused: the files would go to a server the user did not name,
while dspark reported the first one. A non-GET answer announcing more than `MAX_JSON_BYTES` is refused.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urljoin, urlsplit

from dspark_cli.network import (
    CONNECT_TIMEOUT_S,
    MAX_JSON_BYTES,
    Deadline,
    Stalled,
    Timeouts,
    deadline_response,
    timeout_s,
    too_large,
)

MIN_TRANSFER_RATE = 128 * 1024  # bytes/s: a transfer's allowance on top of the request deadline


def _allowance(num_bytes: int) -> float:
    """Seconds a transfer of `num_bytes` gets on top of the request deadline (none for an API call's few bytes)."""
    return float(math.ceil(num_bytes / MIN_TRANSFER_RATE)) if num_bytes > MIN_TRANSFER_RATE else 0.0


def _length(headers: Any) -> int:
    raw = str(headers.get("Content-Length") or "").strip()
    return int(raw) if raw.isdigit() else 0


def _clock(url: str, sending: int) -> Deadline:
    deadline = Deadline(url, Timeouts.from_env(), "answer")
    deadline.extend(_allowance(sending))
    deadline.connected = True  # the clients connect out of sight; what the line says is what came back
    return deadline


def stalled_cause(exc: BaseException) -> Stalled | None:
    """The `Stalled` a hub client's exception carries (the clients wrap and chain what they catch), else None."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        stalled = getattr(current, "stalled", None)
        if isinstance(stalled, Stalled):
            return stalled
        todo += [current.__cause__, current.__context__, *(a for a in current.args if isinstance(a, BaseException))]
    return None


# --- huggingface_hub (httpx) ---------------------------------------------------------------------------------


def _hub_response_check(response: Any) -> None:
    """httpx response hook for the hub clients: no oversized reply, no redirect to another host."""
    import httpx2

    request = response.request
    if response.is_redirect:
        location = request.url.join(response.headers.get("Location", ""))
        if (location.scheme, location.host, location.port) != (request.url.scheme, request.url.host, request.url.port):
            raise httpx2.RemoteProtocolError(
                f"{request.url.host} redirected {request.method} {request.url.path} to "
                f"another host ({location.host}); dspark does not follow it",
                request=request,
            )
    if too_large(response.headers.get("Content-Length"), MAX_JSON_BYTES) and request.method != "GET":
        raise httpx2.RemoteProtocolError(
            f"{request.url.host} announced a {response.headers['Content-Length']}-byte "
            "answer; dspark reads at most "
            f"{MAX_JSON_BYTES:,}",
            request=request,
        )


def _httpx_deadline_hooks() -> tuple[Any, Any]:
    """The request and response hooks that put a deadline on every exchange of an httpx client."""
    import httpx2

    class HubStalled(httpx2.RemoteProtocolError):  # not a timeout to huggingface_hub: it is not retried
        def __init__(self, stalled: Stalled, request: Any) -> None:
            super().__init__(stalled.message, request=request)
            self.stalled = stalled

    class Bounded(httpx2.SyncByteStream):
        """A body, sent or received, that stops at the deadline (checked between its chunks)."""

        def __init__(self, inner: Any, deadline: Deadline, request: Any, *, sending: bool) -> None:
            self.inner, self.deadline, self.request, self.sending = inner, deadline, request, sending

        def __iter__(self) -> Iterator[bytes]:
            for chunk in self.inner:
                try:
                    self.deadline.wait_s()
                except Stalled as exc:
                    raise HubStalled(exc, self.request) from None
                if not self.sending:
                    self.deadline.received += len(chunk)
                yield chunk

        def close(self) -> None:
            close = getattr(self.inner, "close", None)
            if close is not None:
                close()

    def on_request(request: Any) -> None:
        sending = _length(request.headers)
        deadline = _clock(str(request.url), sending)
        if sending:
            deadline.note = f"after {sending:,} bytes sent"
        request.extensions["dspark_deadline"] = deadline
        wait = deadline.wait_s()
        request.extensions["timeout"] = {
            "connect": min(CONNECT_TIMEOUT_S, wait),
            "read": wait,
            "write": wait,
            "pool": wait,
        }
        if isinstance(request.stream, httpx2.SyncByteStream):
            request.stream = Bounded(request.stream, deadline, request, sending=True)

    def on_response(response: Any) -> None:
        deadline = response.request.extensions.get("dspark_deadline")
        if not isinstance(deadline, Deadline) or not isinstance(response.stream, httpx2.SyncByteStream):
            return
        deadline.extend(_allowance(_length(response.headers)))
        deadline.note = ""
        response.stream = Bounded(response.stream, deadline, response.request, sending=False)

    return on_request, on_response


def use_for_hubs() -> None:
    """huggingface_hub's shared HTTP client with dspark's timeouts, deadlines and response checks (its default
    waits forever). ModelScope's client has its own timeouts (MODELSCOPE_API_TIMEOUT), set from ours here;
    its deadlines come with `requests_bounded`."""
    import httpx2
    from huggingface_hub import set_client_factory

    try:
        from huggingface_hub.utils._http import default_client_factory
    except ImportError:  # another huggingface_hub layout: its hooks are lost, the limits still apply

        def default_client_factory() -> httpx2.Client:
            return httpx2.Client(follow_redirects=True)

    on_request, on_response = _httpx_deadline_hooks()

    def factory() -> httpx2.Client:
        client = default_client_factory()
        client.timeout = httpx2.Timeout(timeout_s(), connect=CONNECT_TIMEOUT_S)
        hooks = client.event_hooks
        client.event_hooks = {
            **hooks,
            "request": [*hooks.get("request", []), on_request],
            "response": [*hooks.get("response", []), _hub_response_check, on_response],
        }
        return client

    set_client_factory(factory)
    os.environ.setdefault("MODELSCOPE_API_TIMEOUT", str(int(timeout_s())))
    os.environ.setdefault("MODELSCOPE_API_CONNECT_TIMEOUT", str(int(CONNECT_TIMEOUT_S)))


# --- ModelScope (requests) -----------------------------------------------------------------------------------


def _bounded_timeout(timeout: Any, wait: float) -> Any:
    """A `requests` timeout (None, seconds, or (connect, read)) with every part at most `wait`."""
    if timeout is None:
        return (min(CONNECT_TIMEOUT_S, wait), wait)
    if isinstance(timeout, (int, float)):
        return min(float(timeout), wait)
    if isinstance(timeout, tuple) and len(timeout) == 2:
        return tuple(wait if part is None else min(float(part), wait) for part in timeout)
    return timeout  # urllib3's Timeout object: left as the client made it


@contextlib.contextmanager
def requests_bounded() -> Iterator[None]:
    """While the block runs, every `requests` exchange (ModelScope's client) has dspark's deadline and refuses
    a redirect that leaves the host it asked. requests has no per-client switch for either: its
    `HTTPAdapter.send` and `Session.get_redirect_target` are the steps every request and redirect take, so
    they are wrapped for the block and restored after it."""
    import requests
    import requests.adapters
    import urllib3.connection

    class RequestsStalled(requests.exceptions.ReadTimeout):
        def __init__(self, stalled: Stalled) -> None:
            super().__init__(stalled.message)
            self.stalled = stalled

    original_redirect = requests.Session.get_redirect_target
    original_send = requests.adapters.HTTPAdapter.send
    original_response_class = urllib3.connection.HTTPConnection.response_class
    sending = threading.local()

    def checked(self: Any, response: Any) -> Any:
        target = original_redirect(self, response)
        if target:
            asked, going = urlsplit(response.url), urlsplit(urljoin(response.url, target))
            if (going.scheme, going.netloc) != (asked.scheme, asked.netloc):
                raise requests.exceptions.InvalidURL(
                    f"{asked.netloc} redirected {response.request.method} "
                    f"{asked.path} to another host ({going.netloc}); dspark does "
                    "not follow it"
                )
        return target

    def response_class(connection: Any, sock: Any, *args: Any, **kwargs: Any) -> Any:
        deadline = getattr(sending, "deadline", None)
        if deadline is None:  # a connection made outside `send` (none is, in requests): urllib3's own
            return original_response_class(sock, *args, **kwargs)
        return deadline_response(sock, deadline, *args, **kwargs)

    def send(self: Any, request: Any, stream: bool = False, timeout: Any = None, **kwargs: Any) -> Any:
        deadline = _clock(str(request.url), _length(request.headers))
        sending.deadline = deadline  # the response this thread's connection reads next is this request's
        try:
            response = original_send(
                self, request, stream=stream, timeout=_bounded_timeout(timeout, deadline.wait_s()), **kwargs
            )
            deadline.extend(_allowance(_length(response.headers)))
        except Stalled as exc:
            raise RequestsStalled(exc) from None
        finally:
            sending.deadline = None
        raw = response.raw
        read_stream = getattr(raw, "stream", None)
        if read_stream is not None:  # the body is read after `send`, through the same deadline: its cut, as requests'

            def bounded(*args: Any, **kwargs: Any) -> Iterator[bytes]:
                try:
                    yield from read_stream(*args, **kwargs)
                except Stalled as exc:
                    raise RequestsStalled(exc) from None

            raw.stream = bounded
        return response

    requests.Session.get_redirect_target = checked  # type: ignore[method-assign, assignment]  # patched on purpose
    requests.adapters.HTTPAdapter.send = send  # type: ignore[method-assign, assignment]  # patched on purpose
    urllib3.connection.HTTPConnection.response_class = response_class  # type: ignore[assignment]  # on purpose
    try:
        yield
    finally:
        requests.Session.get_redirect_target = original_redirect  # type: ignore[method-assign]
        requests.adapters.HTTPAdapter.send = original_send  # type: ignore[method-assign]
        urllib3.connection.HTTPConnection.response_class = original_response_class  # type: ignore[misc]
