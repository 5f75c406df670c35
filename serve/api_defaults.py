"""Raw HTTP calls to the documented API that leave out parameters get the documented defaults.

Gradio's ``POST /gradio_api/call/<name>`` needs every input value; with fewer it fails before the
handler runs and answers ``{"error": null}``. ``gradio_client`` fills the defaults itself; this ASGI
middleware does the same for raw HTTP: it pads ``data`` with the defaults of the endpoint's Python
signature, and answers 422 with a one-line message when a parameter without a default (the prompt) is
missing, when there are more values than parameters, or when the body is not ``{"data": [...]}``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import threading
import time
from collections.abc import Callable
from urllib.parse import parse_qs

from packed_ss.inputs import shown

CALL_PREFIX = "/gradio_api/call/"
MAX_BODY_BYTES = 4 * 1024 * 1024  # larger request bodies are refused (413); a prompt is at most 20,000 characters


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


MAX_DEPTH = 8  # JSON nesting a request body may have (the values are scalars and short lists)
UNREAD_S = 5.0  # seconds a raw call or queue join may run before somebody opens its result stream; later it is stopped


class CallListeners:
    """Which events somebody reads: the middleware notes each raw ``/gradio_api/call`` POST's event id and each GET
    of its result stream, and each queue join's event id and session with each GET of that session's
    ``/gradio_api/queue/data`` stream; :meth:`unread` says an event has gone ``unread_s`` seconds unread (a client
    that posted and left, or whose join timed out before it listened)."""

    def __init__(self, unread_s: float = UNREAD_S, keep: int = 10_000):
        self.unread_s = unread_s
        self.keep = keep
        self._posted: dict[str, tuple[float, str | None]] = {}  # event id -> (POST time, monotonic s; its session)
        self._read: set[str] = set()
        self._reading: dict[str, None] = {}  # sessions that opened their queue/data stream (oldest first)
        self._clients: dict[str, str] = {}  # event id -> the address it was sent from
        self._sending: dict[tuple, int] = {}  # (address, kind or None) -> its requests checked, not yet answered
        self._kinds: dict[str, str] = {}  # event id -> its kind, for the events an address may have one of
        self._lock = threading.Lock()

    def posted(self, event_id: str, session: str | None = None, client: str = "", kind: str | None = None) -> None:
        """Note a raw call's event (``session`` None) or a queue join's event of ``session``, sent from the address
        ``client``; ``kind``: the event's queue group where an address may hold only some of its places
        (:meth:`hold`)."""
        with self._lock:
            self._posted[event_id] = (time.monotonic(), session)
            self._clients[event_id] = client
            if kind is not None:
                self._kinds[event_id] = kind
            while len(self._posted) > self.keep:  # bounded: the oldest ids are forgotten
                old = next(iter(self._posted))
                del self._posted[old]
                self._read.discard(old)
                self._clients.pop(old, None)
                self._kinds.pop(old, None)

    def queued(self, client: str, events) -> int:
        """Events sent from the address ``client`` that Gradio's queue still holds (``events``: its event ids, waiting
        or running), and requests of ``client`` being sent (:meth:`hold`)."""
        with self._lock:
            return self._queued(client, events)

    def hold(self, client: str, events, limit: int, kind: str | None = None, share: int = 1) -> int | None:
        """Hold a place for one more request of ``client`` when it has fewer than ``limit`` (:meth:`queued`) and,
        for an event of the queue group ``kind``, fewer than ``share`` of that group: None, and :meth:`arrived`
        gives the place back once the request is answered; else its count (0: it has ``share`` of the group)."""
        with self._lock:
            mine = self._queued(client, events)
            if mine >= limit:
                return mine
            if kind is not None and self._queued(client, events, kind) >= share:
                return 0
            for key in {(client, None), (client, kind)}:
                self._sending[key] = self._sending.get(key, 0) + 1
            return None

    def arrived(self, client: str, kind: str | None = None) -> None:
        """A request :meth:`hold` held a place for is answered: its event (if any) now counts as queued."""
        with self._lock:
            for key in {(client, None), (client, kind)}:
                left = self._sending.get(key, 0) - 1
                if left > 0:
                    self._sending[key] = left
                else:
                    self._sending.pop(key, None)

    def _queued(self, client: str, events, kind: str | None = None) -> int:
        now = time.monotonic()
        return self._sending.get((client, kind), 0) + sum(
            1 for event, who in self._clients.items() if who == client and event in events
            and (kind is None or self._kinds.get(event) == kind)
            and now - self._posted.get(event, (now, None))[0] < QUEUED_S)

    def read(self, event_id: str) -> None:
        """Somebody opened the result stream of the raw call ``event_id``."""
        with self._lock:
            self._read.add(event_id)

    def read_session(self, session: str) -> None:
        """Somebody opened ``session``'s queue/data stream: its events are read (the page's stream may open before
        or after a join)."""
        with self._lock:
            self._reading.pop(session, None)
            self._reading[session] = None
            while len(self._reading) > self.keep:
                del self._reading[next(iter(self._reading))]

    def unread(self, event_id: str) -> bool:
        """Whether ``event_id`` was posted (or joined) and nobody has opened its result stream for ``unread_s``
        seconds."""
        with self._lock:
            found = self._posted.get(event_id)
            if found is None or event_id in self._read or (found[1] is not None and found[1] in self._reading):
                return False
            return time.monotonic() - found[0] > self.unread_s


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


JOIN_PATH = "/gradio_api/queue/join"  # where gradio_client and the page send an event's values
DATA_PATH = "/gradio_api/queue/data"  # where they read the events' results (?session_hash=...)
MAX_ID_CHARS = 256  # a session hash or event id longer than this is no id Gradio made
DIRECT_PREFIXES = ("/gradio_api/run/", "/gradio_api/api/")  # Gradio's direct (unqueued) routes: the page's
# unqueued events post to run/predict with an fn_index; the queued events refuse them (the queue's api_open is off)
PER_CLIENT_EVENTS = 8  # events one client address may have waiting or running in the queue at once


def address_share(concurrency_limit: int) -> int:
    """The places of a queue group running ``concurrency_limit`` events at once that one client address may hold
    (waiting or running): half of them, at least 1. One address's 8 model requests took all 8 of the compute
    group's places, and another visitor's four-token request waited 9 s (fourth recheck of issue 35)."""
    return max(1, int(concurrency_limit) // 2)


QUEUED_S = 900.0  # an event counted that long at most (should Gradio's queue fail to let a finished one go)
SETTLE_S = 1.0  # seconds a request over its address's limit waits for a finished event to leave the queue
COMPONENT_SERVER_PATH = "/gradio_api/component_server"  # a component's own server functions (none on this page)
UPLOAD_ROUTE = "/upload"  # multipart: its own middleware (serve.uploads.BoundUploads) reads it
PATH_SESSION_ROUTES = ("heartbeat", "stream")  # GET /gradio_api/<route>/<session_hash>/...
# Gradio's routes for what this page does not use: each wrote files or told of other visitors (third recheck of
# issue 35): deep links saved a session's whole state to disk per call, the monitoring summary counted everyone's
# requests, screen recordings were posted outside the upload limits, streams took new values for checked events.
UNUSED_ROUTES = {"/gradio_api/deep_link": "deep links", "/gradio_api/process_recording": "screen recording",
                 "/gradio_api/stream": "streaming inputs or outputs", "/monitoring": "public monitoring",
                 "/gradio_api/monitoring": "public monitoring"}
NO_SESSION_HASH = (f"session_hash: 1 to {MAX_ID_CHARS} printable ASCII characters without spaces that name the "
                   f"client's session")


class FillApiDefaults:
    """ASGI middleware padding raw ``/gradio_api/call/<endpoint>`` requests (see the module docstring), and
    answering in one line for an endpoint that does not exist (404), a body nested too deeply, an
    undocumented endpoint sent the wrong number of values, or a file object sent to an event that takes no file
    (422: Gradio would check its path before any handler and answer ``{"error": null}``). With ``events`` and
    ``queue``, a queue join naming no event or sending another number of values than the event takes, and a
    result stream asked for an unknown session or event id, get one line too (404/422; Gradio answered 500, or
    cut the stream off and logged a traceback).

    Args:
        app: the wrapped ASGI app. endpoints: ``{api_name: [(param, default), ...]}`` of the documented ones.
        arity: ``{api_name: number of inputs}`` of every callable endpoint (None: not checked).
        takes_files: api names and event indexes (``fn_index``) whose inputs include a file widget (None: not
            checked).
        events: ``{fn_index: number of inputs}`` of every event of the page (None: not checked).
        queue: ``() -> Gradio's queue`` (``blocks._queue``), to tell whether a result stream has anything to
            send (None: not checked).
        component_server: whether a component of the page has server functions (else that route answers 404).
        shares: ``{fn_index or api name: (its queue group, the places of that group one address may hold)}``: one
            address may have that many of the group's events waiting or running (:func:`address_share`), so that
            it cannot take every place the server runs at once and leave the others waiting behind it.
    """

    def __init__(self, app, endpoints: dict[str, list[tuple[str, object]]], arity: dict[str, int] | None = None,
                 listeners: CallListeners | None = None, takes_files: set | None = None,
                 events: dict[int, int] | None = None, queue: Callable[[], object] | None = None,
                 component_server: bool = True, shares: dict | None = None):
        self.app = app
        self.component_server = component_server
        self.shares = shares or {}
        self.endpoints = endpoints
        self.arity = arity
        self.listeners = listeners
        self.takes_files = takes_files
        self.events = events
        self.queue = queue

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope.get("type") == "http" else ""
        if path.startswith("/gradio_api/"):
            send = validation_in_one_line(send)  # FastAPI's field-by-field 422 answers, as one line
        unused = next((why for route, why in UNUSED_ROUTES.items()
                       if path.rstrip("/") == route or path.startswith(route + "/")), None)
        if unused is not None:  # Gradio's routes for features this page does not have (before any id in them)
            await reply(send, 404, {"error": f"this page has no {unused}"})
            return
        if path.startswith("/gradio_api/"):
            problem = id_problem(path, scope.get("query_string", b""))
            if problem is not None:
                await reply(send, 422, {"error": problem})
                return
            if path.rstrip("/") == COMPONENT_SERVER_PATH and not self.component_server:
                await reply(send, 404, {"error": "no component of this page answers server calls"})
                return
        if scope.get("method") == "POST" and path.rstrip("/") == JOIN_PATH and self.takes_files is not None:
            await self._check_join(scope, receive, send)
            return
        if scope.get("method") == "GET" and self.queue is not None:
            problem = self._stream_problem(path, scope.get("query_string", b""))
            if problem is not None:
                await reply(send, 404, {"error": problem})
                return
        if scope.get("method") == "GET" and path.rstrip("/") == DATA_PATH and self.listeners is not None:
            session = stream_session(scope.get("query_string", b""))
            if session:
                self.listeners.read_session(session)  # somebody reads this session's events
        endpoint = path[len(CALL_PREFIX):].strip("/") if path.startswith(CALL_PREFIX) else ""
        keywords = endpoint.startswith("v2/")  # Gradio's keyword form: {"prompt": ..., "schedule": ...}
        endpoint = endpoint[3:] if keywords else endpoint
        if scope.get("method") == "GET" and endpoint.count("/") == 1 and self.listeners is not None:
            self.listeners.read(endpoint.split("/")[1])  # somebody opened this call's result stream
        direct = next((path[len(p):].strip("/") for p in DIRECT_PREFIXES if path.startswith(p)), None)
        if scope.get("method") == "POST" and direct is not None and self.events is not None:
            await self._check_direct(direct, scope, receive, send)
            return
        if scope.get("method") == "POST" and not endpoint and path.startswith("/gradio_api/") and \
                not path.rstrip("/").endswith(UPLOAD_ROUTE):
            await self._check_session_field(scope, receive, send)  # cancel, reset, the other routes' bodies
            return
        if scope.get("method") != "POST" or not endpoint:
            await self.app(scope, receive, send)
            return
        if "/" in endpoint:
            await reply(send, 404, {"error": f"{path[len('/gradio_api'):]}: no such endpoint; the documented ones "
                                              f"are {', '.join('/' + name for name in self.endpoints)}"})
            return
        kind, share = self.shares.get(endpoint, (None, 1))
        crowded = await self._crowded(scope, kind, share)
        if crowded:
            await reply(send, 429, {"error": crowded})
            return
        if self.listeners is not None:
            send = self._noting_event_ids(send, None, client_of(scope), kind)
        try:
            await self._check_call(endpoint, keywords, scope, receive, send)
        finally:
            self._arrived(scope, kind)

    async def _check_call(self, endpoint: str, keywords: bool, scope, receive, send) -> None:
        """A raw ``POST /gradio_api/call/<endpoint>``: checked, padded with the documented defaults and passed on,
        or answered in one line (see the class docstring)."""
        if self.arity is not None and endpoint not in self.arity and endpoint not in self.endpoints:
            await reply(send, 404, {"error": f"/{endpoint}: no such endpoint; the documented ones are "
                                              f"{', '.join('/' + name for name in self.endpoints)}"})
            return
        body = await read_body(receive, MAX_BODY_BYTES)
        if body is None:
            await reply(send, 413, {"error": f"/{endpoint}: request body over {MAX_BODY_BYTES:,} bytes"})
            return
        too_deep = False
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            payload = None
        except RecursionError:  # nested deeper than Python's parser goes
            payload, too_deep = None, True
        if too_deep or (payload is not None and nesting(payload) > MAX_DEPTH):
            await reply(send, 422, {"error": f"/{endpoint}: the request body nests lists or objects more than "
                                              f"{MAX_DEPTH} deep; the values are numbers, text and short lists"})
            return
        if isinstance(payload, dict) and "session_hash" in payload and not is_session_hash(payload["session_hash"]):
            await reply(send, 422, {"error": f"/{endpoint}: {NO_SESSION_HASH}"})
            return
        if self.takes_files is not None and endpoint not in self.takes_files and holds_file(payload):
            await reply(send, 422, {"error": no_files(f"/{endpoint}")})
            return
        if keywords:
            await self._check_keywords(endpoint, payload, body, scope, receive, send)
            return
        if endpoint not in self.endpoints:  # undocumented (a page event): every value, in order
            await self._check_arity(endpoint, payload, body, scope, receive, send)
            return
        if not isinstance(payload, dict) or "data" not in payload:
            await reply(send, 422, {"error": f"/{endpoint}: send a JSON object {{\"data\": [...]}} with the values in "
                                              f"the order {', '.join(name for name, _ in self.endpoints[endpoint])}"})
            return
        try:
            payload["data"] = fill_defaults(payload["data"], self.endpoints[endpoint], endpoint)
        except ValueError as error:
            await reply(send, 422, {"error": str(error)})
            return
        body = json.dumps(payload).encode()
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await forward(self.app, {**scope, "headers": headers}, body, receive, send)

    async def _check_join(self, scope, receive, send) -> None:
        """Pass a queue join on when it names an event of the server with its values and a session (one line, 404 or
        422, otherwise) and its client has room in the queue (429)."""
        read = await self._event_body(receive, send)
        if read is None:
            return
        body, payload = read
        problem = self.event_problem(payload)
        kind, share = self.shares.get(payload.get("fn_index"), (None, 1)) if problem is None else (None, 1)
        crowded = await self._crowded(scope, kind, share) if problem is None else None
        problem = problem or ((429, crowded) if crowded else None)
        if problem is not None:
            await reply(send, problem[0], {"error": problem[1]})
            return
        if self.listeners is not None:
            send = self._noting_event_ids(send, payload["session_hash"], client_of(scope), kind)
        try:
            await forward(self.app, scope, body, receive, send)
        finally:
            self._arrived(scope, kind)

    async def _event_body(self, receive, send) -> tuple[bytes, dict] | None:
        """The body of an event's POST and its JSON object; None once it is answered (413, or 422: no object)."""
        body = await read_body(receive, MAX_BODY_BYTES)
        if body is None:
            await reply(send, 413, {"error": f"request body over {MAX_BODY_BYTES:,} bytes"})
            return None
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            payload = None
        if not isinstance(payload, dict):
            await reply(send, 422, {"error": "send a JSON object with the event's fn_index, data and session_hash"})
            return None
        return body, payload

    def event_problem(self, payload: dict) -> tuple[int, str] | None:
        """Why an event's values cannot go on, as (status, one line): no session hash Gradio could have made, an
        ``fn_index`` naming no event of the server, a file sent to an event that takes none, another number of
        values than the event takes. None when they can."""
        index, data = payload.get("fn_index"), payload.get("data")
        if not is_session_hash(payload.get("session_hash")):
            return 422, f"an event needs a {NO_SESSION_HASH}"
        if self.events is not None and (not isinstance(index, int) or isinstance(index, bool)
                                        or index not in self.events):
            return 404, self.no_event(index)
        if index not in (self.takes_files or ()) and holds_file(data):
            return 422, no_files(f"event {index}")
        if self.events is not None and (not isinstance(data, list) or len(data) != self.events[index]):
            got = f"{len(data)} values" if isinstance(data, list) else "no list of values"
            return 422, f"event {index} takes {self.events[index]} values in 'data', got {got}"
        return None

    def no_event(self, index) -> str:
        """The one line for an ``fn_index`` that names no event of the server."""
        if isinstance(index, int) and not isinstance(index, bool) and min(self.events) < index < max(self.events):
            return f"event {index} runs in the browser only: there is nothing to call on the server"
        return f"no event {shown(index, 40)}: the page's events are {min(self.events)} to {max(self.events)}"

    async def _crowded(self, scope, kind: str | None = None, share: int = 1) -> str | None:
        """Why this client may not queue another event now (it has :data:`PER_CLIENT_EVENTS` waiting, running or
        being sent, or ``share`` of the queue group ``kind``), or None: then a place is held for it until
        :meth:`_arrived` (checked and held at once, so that a burst of requests sent together cannot all pass the
        check before any is queued)."""
        queue = self.queue() if self.queue is not None else None
        events = getattr(queue, "event_ids_to_events", None)
        if self.listeners is None or events is None:
            return None
        waited = 0.0
        while (mine := self.listeners.hold(client_of(scope), events, PER_CLIENT_EVENTS, kind, share)) is not None \
                and waited < SETTLE_S:  # Gradio lets a finished event go a moment after its last message
            await asyncio.sleep(SETTLE_S / 20)
            waited += SETTLE_S / 20
        if mine is None:
            return None
        if mine == 0 and share == 1:
            return (f"a {kind} from your address is already waiting or running (one at a time per address, as the "
                    f"server runs one for everyone): wait for it to finish")
        if mine == 0:
            return (f"{share} {kind} requests from your address are waiting or running (one address may have "
                    f"{share} at once, so that others find the server free): wait for one to finish")
        return (f"{mine} requests from your address are waiting or running: let them finish (or cancel them) "
                f"before sending more")

    def _arrived(self, scope, kind: str | None = None) -> None:
        """The request :meth:`_crowded` held a place for has been answered (its event, if any, is noted)."""
        if self.listeners is not None and self.queue is not None and \
                getattr(self.queue(), "event_ids_to_events", None) is not None:
            self.listeners.arrived(client_of(scope), kind)

    async def _check_direct(self, name: str, scope, receive, send) -> None:
        """A POST to Gradio's direct routes (``run/<name>``, ``api/<name>``): the page's unqueued events send their
        ``fn_index`` to ``run/predict`` and are checked as a queue join is (:meth:`event_problem`); anything else
        gets the same answer as a queued event called directly (404)."""
        read = await self._event_body(receive, send)
        if read is None:
            return
        body, payload = read
        index = payload.get("fn_index")
        if name != "predict" or not isinstance(index, int) or isinstance(index, bool) or index not in self.events:
            await reply(send, 404, {"error": f"{scope.get('path', '')[len('/gradio_api'):]}: direct calls take the "
                                              f"page's own events only; call the API through the queue "
                                              f"({CALL_PREFIX}<name>, or gradio_client)"})
            return
        problem = (422, f"event {index}: its values nest more than {MAX_DEPTH} deep") \
            if nesting(payload) > MAX_DEPTH else self.event_problem(payload)
        if problem is not None:
            await reply(send, problem[0], {"error": problem[1]})
            return
        await forward(self.app, scope, body, receive, refusals_as_422(send))

    async def _check_session_field(self, scope, receive, send) -> None:
        """Any other POST of Gradio's routes (``cancel``, ``reset``, ...): a ``session_hash`` in its JSON body must
        be one Gradio could have made (422 otherwise); the body is handed on as it came."""
        body = await read_body(receive, MAX_BODY_BYTES)
        if body is None:
            await reply(send, 413, {"error": f"request body over {MAX_BODY_BYTES:,} bytes"})
            return
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            payload = None
        if isinstance(payload, dict) and "session_hash" in payload and not is_session_hash(payload["session_hash"]):
            await reply(send, 422, {"error": f"{scope.get('path', '')[len('/gradio_api'):]}: {NO_SESSION_HASH}"})
            return
        await forward(self.app, scope, body, receive, send)

    async def _check_keywords(self, endpoint: str, payload, body: bytes, scope, receive, send) -> None:
        """Gradio's keyword form (``POST /gradio_api/call/v2/<name>`` with ``{"param": value, ...}``): documented
        endpoints only, with parameters they take (422 naming them)."""
        params = self.endpoints.get(endpoint)
        if params is None:
            await reply(send, 404, {"error": f"/call/v2/{endpoint}: keyword calls take the documented endpoints "
                                              f"only: {', '.join('/' + name for name in self.endpoints)}"})
            return
        names = [name for name, _ in params]
        unknown = sorted(set(payload) - set(names)) if isinstance(payload, dict) else None
        if unknown is None or unknown:
            what = "send a JSON object" if unknown is None else f"unknown parameter(s) {', '.join(unknown)}"
            await reply(send, 422, {"error": f"/call/v2/{endpoint}: {what} of the parameters {', '.join(names)} by "
                                              f"name"})
            return
        missing = [name for name, default in params if default is inspect.Parameter.empty and name not in payload]
        if missing:
            await reply(send, 422, {"error": f"/call/v2/{endpoint}: missing required parameter(s) "
                                              f"{', '.join(missing)}"})
            return
        await forward(self.app, scope, body, receive, send)

    def _stream_problem(self, path: str, query: bytes) -> str | None:
        """Why a GET of a result stream has nothing to send (an unknown session hash or event id, an unknown
        endpoint), or None: Gradio's own route answers."""
        queue = self.queue()
        pending = getattr(queue, "pending_messages_per_session", None)
        if pending is None:
            return None
        if path.rstrip("/") == DATA_PATH:
            session = stream_session(query)
            if session and len(session) <= MAX_ID_CHARS and session in pending:
                return None
            return (f"no event of session {shown(session, 40)} is waiting: join the queue first "
                    f"(POST {JOIN_PATH}) and read the results with the same session_hash")
        if not path.startswith(CALL_PREFIX):
            return None
        parts = path[len(CALL_PREFIX):].strip("/").split("/")
        if parts[0] == "v2":  # the keyword form's result stream
            parts = parts[1:]
        if len(parts) != 2 or (self.arity is not None and parts[0] not in self.arity
                               and parts[0] not in self.endpoints):
            return (f"{path[len('/gradio_api'):]}: no such endpoint; the documented ones are "
                    f"{', '.join('/' + name for name in self.endpoints)}")
        api, event_id = parts
        if len(event_id) <= MAX_ID_CHARS:
            # The event's session (Gradio's route falls back to the id itself, so that a session hash read as an
            # event id streamed that session's results to whoever knew it: fourth recheck of issue 35).
            event = queue.event_ids_to_events.get(event_id)
            session = event.session_hash if event is not None else next(
                (s for s, ids in queue.pending_event_ids_session.items() if event_id in ids), None)
            if session is not None and session in pending:
                return None
        return (f"/{api}: no event {shown(event_id, 40)} is waiting: POST {CALL_PREFIX}{api} first and read its "
                f"result with the event_id it answers")

    def _noting_event_ids(self, send, session: str | None = None, client: str = "", kind: str | None = None):
        """``send`` that also notes the event id a POST's answer carries (``{"event_id": ...}``), as a queue join's
        of ``session`` (from the address ``client``) when given."""
        listeners = self.listeners

        async def noting(message):
            if message.get("type") == "http.response.body" and message.get("body"):
                try:
                    event_id = json.loads(message["body"]).get("event_id")
                except (ValueError, AttributeError, RecursionError):
                    event_id = None
                if isinstance(event_id, str):
                    listeners.posted(event_id, session, client, kind)
            await send(message)

        return noting

    async def _check_arity(self, endpoint: str, payload, body: bytes, scope, receive, send) -> None:
        """Pass an undocumented endpoint's request on when it holds every value, else answer 422."""
        expected = (self.arity or {}).get(endpoint)
        data = payload.get("data") if isinstance(payload, dict) else None
        if expected is not None and (not isinstance(data, list) or len(data) != expected):
            got = f"{len(data)} values" if isinstance(data, list) else "no list of values"
            await reply(send, 422, {"error": f"/{endpoint} takes {expected} values in 'data' (this endpoint has no "
                                              f"defaults), got {got}"})
            return
        await forward(self.app, scope, body, receive, send)


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


def answers_with(status: int, send, rewrite):
    """``send`` where an answer of HTTP ``status`` is held until its (whole) body comes, and then sent as
    ``rewrite(start, body)`` gives it: ``(start, body)`` again, or changed (a status, a body); other answers pass
    unchanged. A body sent in several parts is passed as it comes."""
    held = []

    async def sending(message):
        if message.get("type") == "http.response.start" and message.get("status") == status:
            held.append(message)
            return
        if held and message.get("type") == "http.response.body":
            start = held.pop()
            if not message.get("more_body"):
                start, body = rewrite(start, message.get("body") or b"")
                message = dict(message, body=body)
            await send(start)
        await send(message)

    return sending


def refusals_as_422(send):
    """``send`` for Gradio's direct route, whose answer to any error a handler raises is HTTP 500: a one-line refusal
    (``{"error": "<text>"}``, the handlers' UserError) goes out as 422; a 500 without a message stays 500."""
    def rewrite(start, body):
        try:
            error = json.loads(body or b"{}").get("error")
        except (ValueError, AttributeError, RecursionError):
            error = None
        return (dict(start, status=422) if isinstance(error, str) and error else start), body

    return answers_with(500, send, rewrite)


def validation_in_one_line(send):
    """``send`` with FastAPI's request-validation answers (422, ``{"detail": [{"loc": [...], "msg": ...}, ...]}``:
    a JSON body sent as text/plain, a ``fn_index`` that is no number) rewritten as this server's one line,
    ``{"error": "<field>: <what is wrong> (got <value>)"}``; every other answer passes unchanged."""
    def rewrite(start, body):
        line = one_line(body)
        if line is None:
            return start, body
        data = json.dumps({"error": line}).encode()
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        print(f"refused (422): {line}", file=sys.stderr, flush=True)
        return dict(start, headers=headers + [(b"content-length", str(len(data)).encode())]), data

    return answers_with(422, send, rewrite)


def one_line(body: bytes) -> str | None:
    """The one line of a FastAPI validation answer's body (None when it is not one)."""
    try:
        details = json.loads(body).get("detail")
    except (ValueError, AttributeError, RecursionError):
        return None
    if not isinstance(details, list) or not details or not all(isinstance(d, dict) for d in details):
        return None
    first = details[0]
    where = ".".join(str(part) for part in first.get("loc", []) if part != "body") or "the body"
    line = f"{where}: {first.get('msg', 'not accepted')}"
    given = first.get("input")
    if where == "the body" and isinstance(given, str):
        line += " (send the JSON body with Content-Type: application/json)"
    elif given is not None and not isinstance(given, (dict, list)):
        line += f" (got {shown(given)})"
    return line + (f"; and {len(details) - 1} more" if len(details) > 1 else "")


async def forward(app, scope, body: bytes, receive, send) -> None:
    """Hand the request on to ``app`` with ``body`` (already read from ``receive``) as its body."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    await app(scope, replay, send)


async def read_body(receive, limit: int, within_s: float | None = None) -> bytes | None:
    """An ASGI request's whole body, or None as soon as it passes ``limit`` bytes.

    Raises: TimeoutError when the whole body has not arrived ``within_s`` seconds after the first read (None: no
    bound), e.g. an upload trickled a few bytes at a time to hold a connection open."""
    deadline = None if within_s is None else asyncio.get_running_loop().time() + within_s
    body, more = b"", True
    while more:
        if deadline is None:
            message = await receive()
        else:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
        body += message.get("body", b"")
        more = message.get("more_body", False)
        if len(body) > limit:
            return None
    return body


async def reply(send, status: int, content: dict) -> None:
    """Answer a refused request with ``status`` and ``content`` (JSON), and print its one line to the server log."""
    print(f"refused ({status}): {content.get('error')}", file=sys.stderr, flush=True)
    data = json.dumps(content).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
