"""The server's request gate: the ASGI middleware every request to Gradio's routes passes before Gradio sees it.

In order it refuses routes the page does not use, ids Gradio could not have made, an address past its share of
the queue (:mod:`serve.address_shares`), and events or calls whose values do not fit (:mod:`serve.request_checks`,
:mod:`serve.raw_calls`), each in one line; it notes who reads which result stream. Uploads have their own
middleware (:mod:`serve.uploads`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from packed_ss.inputs import shown

from serve.address_shares import PER_CLIENT_EVENTS, SETTLE_S, CallListeners
from serve.asgi_io import ArrivingBodies, forward, receive_body, refusals_as_422, reply, validation_in_one_line
from serve.raw_calls import RawCallChecks
from serve.request_checks import (CALL_PREFIX, COMPONENT_SERVER_PATH, DATA_PATH, DIRECT_PREFIXES, JOIN_PATH,
                                  MAX_BODY_BYTES, MAX_DEPTH, MAX_ID_CHARS, NO_SESSION_HASH, UNUSED_ROUTES,
                                  UPLOAD_ROUTE, client_of, holds_file, id_problem, is_session_hash, nesting, no_files,
                                  stream_session)


TOO_BIG = f"request body over {MAX_BODY_BYTES:,} bytes"


class RequestGate(RawCallChecks):
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
        bodies: what request bodies may hold while they arrive (:class:`serve.asgi_io.ArrivingBodies`; shared with
            the upload middleware); a body must be whole within :data:`serve.asgi_io.BODY_WITHIN_S` s (408).
    """

    def __init__(self, app, endpoints: dict[str, list[tuple[str, object]]], arity: dict[str, int] | None = None,
                 listeners: CallListeners | None = None, takes_files: set | None = None,
                 events: dict[int, int] | None = None, queue: Callable[[], object] | None = None,
                 component_server: bool = True, shares: dict | None = None, bodies: ArrivingBodies | None = None):
        self.app = app
        self.bodies = bodies if bodies is not None else ArrivingBodies()
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

    async def _check_join(self, scope, receive, send) -> None:
        """Pass a queue join on when it names an event of the server with its values and a session (one line, 404 or
        422, otherwise) and its client has room in the queue (429)."""
        read = await self._event_body(scope, receive, send)
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

    async def _event_body(self, scope, receive, send) -> tuple[bytes, dict] | None:
        """The body of an event's POST and its JSON object; None once it is answered (408, 413, 429:
        :func:`serve.asgi_io.receive_body`; 422: no object)."""
        body = await receive_body(scope, receive, send, MAX_BODY_BYTES, self.bodies, TOO_BIG)
        if body is None:
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
        read = await self._event_body(scope, receive, send)
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
        body = await receive_body(scope, receive, send, MAX_BODY_BYTES, self.bodies, TOO_BIG)
        if body is None:
            return
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            payload = None
        if isinstance(payload, dict) and "session_hash" in payload and not is_session_hash(payload["session_hash"]):
            await reply(send, 422, {"error": f"{scope.get('path', '')[len('/gradio_api'):]}: {NO_SESSION_HASH}"})
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
            # event id streamed that session's results to whoever knew it: issue 35).
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
