"""Raw HTTP calls to the documented API that leave out parameters get the documented defaults.

Gradio's ``POST /gradio_api/call/<name>`` needs every input value; with fewer it fails before the
handler runs and answers ``{"error": null}``. ``gradio_client`` fills the defaults itself; this ASGI
middleware does the same for raw HTTP: it pads ``data`` with the defaults of the endpoint's Python
signature, and answers 422 with a one-line message when a parameter without a default (the prompt) is
missing, when there are more values than parameters, or when the body is not ``{"data": [...]}``.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable

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


class FillApiDefaults:
    """ASGI middleware padding raw ``/gradio_api/call/<endpoint>`` requests (see the module docstring).

    Args:
        app: the wrapped ASGI app. endpoints: ``{api_name: [(param, default), ...]}``.
    """

    def __init__(self, app, endpoints: dict[str, list[tuple[str, object]]]):
        self.app = app
        self.endpoints = endpoints

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope.get("type") == "http" else ""
        endpoint = path[len(CALL_PREFIX):].strip("/") if path.startswith(CALL_PREFIX) else ""
        if scope.get("method") != "POST" or endpoint not in self.endpoints:
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_BODY_BYTES:
                await _reply(send, 413, {"error": f"/{endpoint}: request body over {MAX_BODY_BYTES:,} bytes"})
                return
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            payload = None
        if not isinstance(payload, dict) or "data" not in payload:
            await _reply(send, 422, {"error": f"/{endpoint}: send a JSON object {{\"data\": [...]}} with the values in "
                                              f"the order {', '.join(name for name, _ in self.endpoints[endpoint])}"})
            return
        try:
            payload["data"] = fill_defaults(payload["data"], self.endpoints[endpoint], endpoint)
        except ValueError as error:
            await _reply(send, 422, {"error": str(error)})
            return
        body = json.dumps(payload).encode()
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app({**scope, "headers": headers}, replay, send)


async def _reply(send, status: int, content: dict) -> None:
    data = json.dumps(content).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
