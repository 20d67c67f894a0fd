"""Every HTTP exchange dspark starts (bench's endpoints, publish's hubs): how long it waits, how much it reads.

    from dspark_cli.network import MAX_JSON_BYTES, read_limited, timeout_s
    with urllib.request.urlopen(url, timeout=timeout_s()) as response:
        body = read_limited(response, MAX_JSON_BYTES, url)
    use_for_hubs()          # huggingface_hub's client: the same timeouts and bounds

A server that accepts the connection and then says nothing is given up on after `timeout_s()`
seconds of silence (`DSPARK_HTTP_TIMEOUT`, default 300: between two reads, not for a whole
upload or a whole streamed answer; a long prefill at high concurrency stays well inside it). An
answer is read only up to its bound (`MAX_JSON_BYTES` for an API reply, `MAX_STREAM_BYTES` for
one streamed completion), and one that announces more in its Content-Length is refused before a
byte of the body is read. A redirect that leaves the host asked is refused for the hubs: the
files would go to a server the user did not name, while dspark reported the first one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urljoin, urlsplit

from dspark_cli.errors import DataError

DEFAULT_TIMEOUT_S = 300.0
CONNECT_TIMEOUT_S = 10.0
MAX_JSON_BYTES = 16 * 2**20  # /v1/models, a hub's JSON reply, vLLM's /metrics
MAX_STREAM_BYTES = 64 * 2**20  # one streamed chat completion, every chunk together
MAX_LINE_BYTES = 2**20  # one server-sent-events line


def timeout_s() -> float:
    """Seconds of silence after which a server is given up on (DSPARK_HTTP_TIMEOUT, else 300)."""
    raw = os.environ.get("DSPARK_HTTP_TIMEOUT", "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


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


@contextlib.contextmanager
def requests_stay_on_host() -> Iterator[None]:
    """While the block runs, a `requests` session (ModelScope's client) refuses a redirect that leaves the
    host it asked (requests has no per-client switch for it; its `get_redirect_target` is the one step every
    redirect takes)."""
    import requests

    original = requests.Session.get_redirect_target

    def checked(self: Any, response: Any) -> Any:
        target = original(self, response)
        if target:
            asked, going = urlsplit(response.url), urlsplit(urljoin(response.url, target))
            if (going.scheme, going.netloc) != (asked.scheme, asked.netloc):
                raise requests.exceptions.InvalidURL(
                    f"{asked.netloc} redirected {response.request.method} "
                    f"{asked.path} to another host ({going.netloc}); dspark does "
                    "not follow it"
                )
        return target

    requests.Session.get_redirect_target = checked  # type: ignore[method-assign, assignment]  # patched on purpose
    try:
        yield
    finally:
        requests.Session.get_redirect_target = original  # type: ignore[method-assign]


def use_for_hubs() -> None:
    """huggingface_hub's shared HTTP client with dspark's timeouts and response checks (its default waits
    forever). ModelScope's client has its own timeouts (MODELSCOPE_API_TIMEOUT), set from ours here."""
    import httpx2
    from huggingface_hub import set_client_factory

    try:
        from huggingface_hub.utils._http import default_client_factory
    except ImportError:  # another huggingface_hub layout: its hooks are lost, the limits still apply

        def default_client_factory() -> httpx2.Client:
            return httpx2.Client(follow_redirects=True)

    def factory() -> httpx2.Client:
        client = default_client_factory()
        client.timeout = httpx2.Timeout(timeout_s(), connect=CONNECT_TIMEOUT_S)
        client.event_hooks = {
            **client.event_hooks,
            "response": [*client.event_hooks.get("response", []), _hub_response_check],
        }
        return client

    set_client_factory(factory)
    os.environ.setdefault("MODELSCOPE_API_TIMEOUT", str(int(timeout_s())))
    os.environ.setdefault("MODELSCOPE_API_CONNECT_TIMEOUT", str(int(CONNECT_TIMEOUT_S)))
