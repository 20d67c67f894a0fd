"""Where a Mooncake stream lives, and whether its master answers, judged without the Mooncake client.

    where = parse_location("mooncake://10.0.0.5:50051/k3-run1?admin_port=9003&timeout=30")
    where.master, where.admin, where.namespace, where.timeout_s   # '10.0.0.5:50051', '10.0.0.5:9003', ...
    probe_master(where, 2.0)       # None, or (what did not answer, naming the address; a hint)

`parse_location` raises a one-line UsageError naming the part of a malformed location that is wrong
(scheme, host, port, namespace, an option); `probe_master` asks both of the master's ports for an
answer within a deadline, with Python sockets only. The store (mooncake_store.py) and the preflight
(preflight/stream.py) use both, so `dspark validate` refuses what a training rank would meet.
Standard library and dspark_cli.network only: the preflight imports this without Mooncake installed.
"""

from __future__ import annotations

import difflib
import http.client
import math
import re
import socket
import struct
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import parse_qsl

from dspark_cli.errors import UsageError
from dspark_cli.network import Stalled, Timeouts, exchange

SCHEME = "mooncake"
DEFAULT_RPC_PORT = 50051
DEFAULT_ADMIN_PORT = 9003
DEFAULT_TIMEOUT_S = 30.0  # `?timeout=`: the master's ports answering, and each key listing
OPTIONS = ("admin_port", "segment", "protocol", "device", "local_hostname", "timeout")
# The master speaks coro_rpc (yalantinglibs): a 20-byte request header whose first byte is this magic. A
# request for function id 0 (none) is answered at once with "the rpc function not registered"; a master
# that accepts connections but never answers is stalled (Mooncake's own client then retries 20 x 30 s,
# holding the GIL, so no Python thread can bound it: hence this probe first).
RPC_MAGIC = 21


def admin_timeouts(seconds: float) -> Timeouts:
    """The master's admin port is asked with one bound for the whole exchange and each read (?timeout=); it is
    asked directly (`exchange(..., direct=True)`): an http_proxy of the environment has no route to it."""
    return Timeouts(request_s=seconds, read_s=seconds, request_setting="?timeout=", read_setting="?timeout=")


_RPC_PING = struct.pack(
    "<BBBBIIII", RPC_MAGIC, 0, 0, 0, 1, 0, 0, 0
)  # magic, version, serialize, type, seq, fn, len, attach
MIN_SEGMENT = 16 << 20  # a client lends nothing or at least this much
_SIZE = re.compile(r"^(\d+)\s*([kmgt]?i?b?)?$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(frozen=True)
class MooncakeLocation:
    """A parsed `mooncake://` location."""

    master: str  # host:rpc_port
    admin: str  # host:admin_port
    namespace: str
    segment_bytes: int = 0
    protocol: str = "tcp"
    device: str = ""
    local_hostname: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S


def _size(text: str, location: str) -> int:
    match = _SIZE.match(text.strip())
    if not match:
        raise UsageError(f"stream {location}: segment={text!r} is not a size", "write bytes, or e.g. 512MB, 4GB")
    return int(match.group(1)) * _UNITS[(match.group(2) or "").lower()[:1]]


def _port(text: str, what: str, location: str, hint: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise UsageError(f"stream {location}: {what} {text!r} is not a port number (1-65535)", hint)
    return int(text)


def _host_port(authority: str, location: str, hint: str) -> tuple[str, int]:
    """`HOST[:PORT]` or `[IPV6][:PORT]` -> (host, port); the part that is wrong named."""
    if not authority:
        raise UsageError(
            f"stream {location}: no host: the Mooncake master's address is missing after mooncake://", hint
        )
    if "@" in authority:
        raise UsageError(f"stream {location}: {authority!r}: a user name has no place in a Mooncake location", hint)
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise UsageError(
                f"stream {location}: host {authority!r} opens '[' and never closes it",
                "write an IPv6 master as mooncake://[::1]:50051/NAMESPACE",
            )
        host, rest = authority[1:close], authority[close + 1 :]
        if rest and not rest.startswith(":"):
            raise UsageError(f"stream {location}: {rest!r} after the IPv6 address {host!r}", hint)
        port_text = rest[1:] if rest else None
    else:
        host, colon, port_text_raw = authority.partition(":")
        port_text = port_text_raw if colon else None
    if not host:
        raise UsageError(f"stream {location}: no host before the port in {authority!r}", hint)
    if not re.fullmatch(r"[0-9A-Za-z:.%]+" if authority.startswith("[") else r"[A-Za-z0-9_.\-]+", host):
        raise UsageError(f"stream {location}: host {host!r} is not a host name or address", hint)
    port = DEFAULT_RPC_PORT if port_text is None else _port(port_text, "port", location, hint)
    return host, port


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_location(location: str) -> MooncakeLocation:
    """`mooncake://HOST[:PORT]/NAMESPACE[?...]` -> MooncakeLocation; a one-line UsageError naming the part
    that is wrong (scheme, host, port, namespace, an option) if malformed. Nothing is contacted."""
    hint = "write mooncake://MASTER_HOST:50051/NAMESPACE[?admin_port=9003&segment=0&protocol=tcp&timeout=30]"
    scheme, sep, rest = location.partition("://")
    if scheme != SCHEME or not sep:
        got = f"the scheme {scheme}://" if sep else "no scheme"
        raise UsageError(f"stream {location}: {got}, not {SCHEME}:// (lower case)", hint)
    rest, hash_sign, fragment = rest.partition("#")
    if hash_sign:
        raise UsageError(f"stream {location}: '#{fragment}' has no meaning in a Mooncake location", hint)
    rest, _, query_text = rest.partition("?")
    authority, _, path = rest.partition("/")
    host, port = _host_port(authority, location, hint)
    namespace = path.strip("/")
    if not namespace:
        raise UsageError(f"stream {location}: no namespace after the master's address", hint)
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*", namespace):
        raise UsageError(f"stream {location}: namespace {namespace!r} must be letters, digits, _ . - and /", hint)
    query: dict[str, str] = {}
    for key, value in parse_qsl(query_text, keep_blank_values=True):
        if key not in OPTIONS:
            close = difflib.get_close_matches(key, OPTIONS, n=1)
            guess = f" (did you mean {close[0]}?)" if close else ""
            raise UsageError(f"stream {location}: unknown option {key!r}{guess}", f"options: {', '.join(OPTIONS)}")
        if key in query:
            raise UsageError(f"stream {location}: option {key} is given twice", "give each option once")
        query[key] = value
    protocol = query.get("protocol", "tcp")
    if protocol not in ("tcp", "rdma"):
        raise UsageError(
            f"stream {location}: protocol={protocol!r} is not one Mooncake speaks", "use protocol=tcp or protocol=rdma"
        )
    admin_port = _port(query.get("admin_port", str(DEFAULT_ADMIN_PORT)), "admin_port", location, hint)
    if admin_port == port:
        raise UsageError(
            f"stream {location}: admin_port={admin_port} is the RPC port too",
            "give the master's -metrics_port as admin_port (9003 by default), its -rpc_port after the host",
        )
    segment = _size(query.get("segment", "0"), location)
    if 0 < segment < MIN_SEGMENT:
        raise UsageError(
            f"stream {location}: segment={query['segment']} is below Mooncake's 16 MiB minimum",
            "lend 0 (the default) or at least 16MB",
        )
    try:
        timeout_s = float(query.get("timeout", DEFAULT_TIMEOUT_S))
    except ValueError:
        timeout_s = math.nan
    if not 0 < timeout_s <= 7 * 24 * 3600:  # NaN fails too
        raise UsageError(
            f"stream {location}: timeout={query['timeout']!r} is not a number of seconds above 0 (at most a week)",
            f"e.g. timeout=30 (the default: {DEFAULT_TIMEOUT_S:g} s)",
        )
    return MooncakeLocation(
        _address(host, port),
        _address(host, admin_port),
        namespace,
        segment,
        protocol,
        query.get("device", ""),
        query.get("local_hostname", ""),
        timeout_s,
    )


def probe_master(where: MooncakeLocation, timeout_s: float) -> tuple[str, str] | None:
    """Whether the master answers within `timeout_s` in all: its RPC port (a coro_rpc request for no
    function, which a master answers at once), then its admin port (HTTP /health). None when both answer, else
    (what did not, in words naming the address; a hint). Python sockets only: no Mooncake client needed."""
    deadline = time.monotonic() + timeout_s
    hint = "start mooncake_master there (-rpc_port, -metrics_port; ?admin_port= names the latter), or fix the address"
    host, _, port = where.master.rpartition(":")
    address = (host.strip("[]"), int(port))
    what = f"{where.master} (the Mooncake master's RPC port)"
    try:
        sock = socket.create_connection(address, timeout=max(deadline - time.monotonic(), 0.01))
    except socket.gaierror as exc:
        return f"the master's host {address[0]} does not resolve ({exc.strerror})", hint
    except TimeoutError:
        return f"{what} did not accept a connection within {timeout_s:g} s", hint
    except ConnectionRefusedError:
        return f"nothing listens at {what}", hint
    except OSError as exc:
        return f"{what} cannot be reached ({exc.strerror or exc})", hint
    try:
        with sock:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            sock.sendall(_RPC_PING)
            first = sock.recv(1)
    except TimeoutError:
        return (
            f"{what} accepted a connection but did not reply to a request within {timeout_s:g} s "
            "(a stopped or stuck mooncake_master)",
            "restart mooncake_master, or fix the address",
        )
    except OSError as exc:
        return f"{what} dropped the connection without replying ({exc.strerror or exc})", hint
    if not first:
        return f"{what} closed the connection without answering: not a mooncake_master RPC port", hint
    if first[0] != RPC_MAGIC:
        return f"{what} answers, but not as a Mooncake master (first byte {first!r})", hint
    try:
        wait = max(deadline - time.monotonic(), 0.01)
        with exchange(f"http://{where.admin}/health", admin_timeouts(wait), direct=True) as (response, _):
            response.read(1024)
    except Stalled:
        return f"the Mooncake master's admin port {where.admin} does not answer within {timeout_s:g} s", hint
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        waited = f"within {timeout_s:g} s" if isinstance(reason, TimeoutError) else f"({reason})"
        return f"the Mooncake master's admin port {where.admin} does not answer {waited}", hint
    return None
