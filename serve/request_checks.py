"""What a request to Gradio's routes must look like before it is handed on: pure checks of paths, ids and bodies.

Each check answers with one line (or None when the request may go on); :mod:`serve.request_gate` decides the status.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from urllib.parse import parse_qs


CALL_PREFIX = "/gradio_api/call/"
JOIN_PATH = "/gradio_api/queue/join"  # where gradio_client and the page send an event's values
DATA_PATH = "/gradio_api/queue/data"  # where they read the events' results (?session_hash=...)
DIRECT_PREFIXES = ("/gradio_api/run/", "/gradio_api/api/")  # Gradio's direct (unqueued) routes: the page's
COMPONENT_SERVER_PATH = "/gradio_api/component_server"  # a component's own server functions (none on this page)
UPLOAD_ROUTE = "/upload"  # multipart: its own middleware (serve.uploads.BoundUploads) reads it
PATH_SESSION_ROUTES = ("heartbeat", "stream")  # GET /gradio_api/<route>/<session_hash>/...
MAX_BODY_BYTES = 4 * 1024 * 1024  # larger request bodies are refused (413); a prompt is at most 20,000 characters
MAX_DEPTH = 8  # JSON nesting a request body may have (the values are scalars and short lists)
MAX_ID_CHARS = 256  # a session hash or event id longer than this is no id Gradio made
# Gradio's routes for what this page does not use: each wrote files or told of other visitors (issue
# 35): deep links saved a session's whole state to disk per call, the monitoring summary counted everyone's
# requests, screen recordings were posted outside the upload limits, streams took new values for checked events.
UNUSED_ROUTES = {"/gradio_api/deep_link": "deep links", "/gradio_api/process_recording": "screen recording",
                 "/gradio_api/stream": "streaming inputs or outputs", "/monitoring": "public monitoring",
                 "/gradio_api/monitoring": "public monitoring"}
NO_SESSION_HASH = (f"session_hash: 1 to {MAX_ID_CHARS} printable ASCII characters without spaces that name the "
                   f"client's session")


def signature_defaults(fn: Callable) -> list[tuple[str, object]]:
    """``[(name, default)]`` of ``fn``'s parameters in order; ``inspect.Parameter.empty`` when required."""
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def fill_defaults(data, params: list[tuple[str, object]], endpoint: str) -> list:
    """``data`` padded with the defaults of the parameters it leaves out.

    Raises: ValueError naming the endpoint and the missing required parameters, or a non-list ``data``.
    """
    if not isinstance(data, list):
        raise ValueError(f"/{endpoint}: 'data' must be a list of parameter values in the order "
                         f"{', '.join(name for name, _ in params)}")
    if len(data) > len(params):
        raise ValueError(f"/{endpoint}: {len(data)} values for {len(params)} parameters "
                         f"({', '.join(name for name, _ in params)})")
    missing = [name for name, default in params[len(data):] if default is inspect.Parameter.empty]
    if missing:
        raise ValueError(f"/{endpoint}: missing required parameter(s) {', '.join(missing)} (values in the order "
                         f"{', '.join(name for name, _ in params)}; later ones have defaults)")
    return data + [default for _, default in params[len(data):]]


def nesting(value) -> int:
    """How deeply lists and objects nest in a parsed JSON value (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth + 1)
            if depth + 1 <= MAX_DEPTH:  # deeper than the limit: the answer is already "too deep"
                stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def holds_file(value) -> bool:
    """Whether a parsed JSON value holds a Gradio file object (``{"path": ..., "meta": {"_type": "gradio.FileData"}}``)
    at any depth (without recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            meta = item.get("meta")
            if "path" in item and isinstance(meta, dict) and meta.get("_type") == "gradio.FileData":
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def id_problem(path: str, query: bytes) -> str | None:
    """Why a request's session hash (in its query string's ``session_hash``, or in the path of a ``heartbeat`` or
    a stream's GET) is none Gradio could have made, or None. Gradio hands them to its analytics and to httpx, which
    fail on a lone surrogate or a NUL and took later events down with them (issue 35, N1)."""
    hashes = parse_qs(query.decode("latin-1"), keep_blank_values=True).get("session_hash", [])
    parts = path.split("/")  # "", "gradio_api", route, ... (the ASGI path is decoded already)
    if len(parts) > 3 and parts[2] in PATH_SESSION_ROUTES:
        hashes.append(parts[3])
    if all(is_session_hash(h) for h in hashes):
        return None
    route = parts[2] if parts[2] in PATH_SESSION_ROUTES else "/".join(parts[2:4])  # never the hash itself
    return f"/{route}: {NO_SESSION_HASH}"


def is_session_hash(value) -> bool:
    """Whether ``value`` can be a session hash: 1 to :data:`MAX_ID_CHARS` printable ASCII characters, no spaces
    (Gradio's own are short random letters and digits; a lone surrogate broke its clean-up of every later event)."""
    return (isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS and value.isascii() and value.isprintable()
            and " " not in value)


def client_of(scope) -> str:
    """The client address of an ASGI ``scope`` ("" when it has none)."""
    return str((scope.get("client") or ("",))[0] or "")


def stream_session(query: bytes) -> str:
    """The one ``session_hash`` a queue/data GET's query string names ("" for none, or several)."""
    hashes = parse_qs(query.decode("latin-1")).get("session_hash", [""])
    return hashes[0] if len(hashes) == 1 else ""


def no_files(where: str) -> str:
    """The one line for a file object sent where no file is taken."""
    return (f"{where} takes no files: a file reaches the app only through the page's own upload widgets (the "
            f"values are numbers, text and short lists)")
