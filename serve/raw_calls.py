"""The checks of raw API calls (``POST /gradio_api/call/<name>``): padded with the documented defaults, or one line.

Gradio's call route needs every input value; with fewer it fails before the handler runs and answers
``{"error": null}``. ``gradio_client`` fills the defaults itself; :class:`RawCallChecks` does the same for raw HTTP:
it pads ``data`` with the defaults of the endpoint's Python signature, and answers 422 with one line when a
parameter without a default (the prompt) is missing, when there are more values than parameters, or when the body
is not ``{"data": [...]}``. :class:`serve.request_gate.RequestGate` runs these checks after the address's share.
"""

from __future__ import annotations

import inspect
import json

from serve.asgi_io import forward, receive_body, reply
from serve.request_checks import MAX_BODY_BYTES, MAX_DEPTH, NO_SESSION_HASH, fill_defaults, holds_file, \
    is_session_hash, nesting, no_files


class RawCallChecks:
    """The raw-call half of :class:`serve.request_gate.RequestGate` (its attributes: ``app``, ``endpoints``,
    ``arity``, ``takes_files``, ``bodies``)."""

    async def _check_call(self, endpoint: str, keywords: bool, scope, receive, send) -> None:
        """A raw ``POST /gradio_api/call/<endpoint>``: checked, padded with the documented defaults and passed on,
        or answered in one line (see the class docstring)."""
        if self.arity is not None and endpoint not in self.arity and endpoint not in self.endpoints:
            await reply(send, 404, {"error": f"/{endpoint}: no such endpoint; the documented ones are "
                                              f"{', '.join('/' + name for name in self.endpoints)}"})
            return
        body = await receive_body(scope, receive, send, MAX_BODY_BYTES, self.bodies,
                                  f"/{endpoint}: request body over {MAX_BODY_BYTES:,} bytes")
        if body is None:
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
