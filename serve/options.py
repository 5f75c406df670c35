"""The app's command line (``python app.py --help``): the options, the Space's variables that set their
defaults, and the checks made before the server starts (a mistyped folder fails here, not in a visitor's
first request)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from packed_ss.cli import add_model_flags, resolve_compile
from packed_ss.inputs import threads_problem
from packed_ss.models import ModelLoadError, device_dtype_problem
from packed_ss.models.errors import local_folder

from serve.limits import MAX_ROWS_PER_REQUEST, MAX_SECONDS_PER_REQUEST
from serve.models import ANY_ORDER_MODEL, DEFAULT_MODEL
from serve.settings import NEW_TOKENS_CAP


# uvicorn trusting every hop takes an X-Forwarded-For list's first entry, which the client writes: every per-address
# limit (serve.address_shares, serve.admission, serve.uploads, serve.sessions) would be one a client sets itself
TRUSTS_EVERY_ADDRESS = ("FORWARDED_ALLOW_IPS=* lets every client name its own address (uvicorn then counts the first "
                        "X-Forwarded-For entry, which the client writes): set it to the proxy's addresses, e.g. "
                        "10.0.0.0/8")


def app_parser() -> argparse.ArgumentParser:
    """The options; a Space sets the default model, the others offered, the adapter and SetDLM's base model
    as variables (``PACKED_SS_MODEL``, ``PACKED_SS_ALLOW_MODELS``, ``PACKED_SS_DRAFTER_LORA``,
    ``PACKED_SS_BASE_MODEL``)."""
    environ = os.environ
    p = argparse.ArgumentParser(description="packed-ss Gradio app")
    p.add_argument("--model", default=environ.get("PACKED_SS_MODEL") or DEFAULT_MODEL,
                   help="default model folder or hub id (env PACKED_SS_MODEL; default: the embedded model)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16... (default: float32 on CPU)")
    p.add_argument("--host", default=None, help="server name, e.g. 0.0.0.0")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--cap", type=int, default=NEW_TOKENS_CAP, help="largest new-token limit")
    p.add_argument("--allow-model", action="append", default=None, metavar="NAME",
                   help="another folder or hub id visitors may choose (repeatable; env PACKED_SS_ALLOW_MODELS, "
                        "comma-separated; default: the shipped any-order model, assets/model-anyorder)")
    p.add_argument("--models-held", type=int, default=2, help="models kept loaded at once (default 2)")
    p.add_argument("--max-rows", type=int, default=MAX_ROWS_PER_REQUEST,
                   help=f"worst-case model rows one request may need (default {MAX_ROWS_PER_REQUEST:,})")
    p.add_argument("--max-seconds", type=float, default=MAX_SECONDS_PER_REQUEST,
                   help="predicted worst-case decoder seconds one request may take "
                        f"(default {MAX_SECONDS_PER_REQUEST:g})")
    p.add_argument("--queue-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads per model call (default: measured at the first request, 1 against the "
                        "cores, and again when calls drift)")
    add_model_flags(p)
    p.set_defaults(drafter_lora=environ.get("PACKED_SS_DRAFTER_LORA") or None,
                   base_model=environ.get("PACKED_SS_BASE_MODEL") or None)
    return p


def allowed_models(args: argparse.Namespace) -> list[str]:
    """The further models offered: ``--allow-model``, else ``PACKED_SS_ALLOW_MODELS``, else the shipped
    any-order model (for the verification-order selector) when it is there."""
    allowed_env = [n.strip() for n in os.environ.get("PACKED_SS_ALLOW_MODELS", "").split(",") if n.strip()]
    if args.allow_model is not None:
        return list(args.allow_model)
    if not allowed_env and (Path(ANY_ORDER_MODEL) / "config.json").is_file():
        return [ANY_ORDER_MODEL]
    return allowed_env


def options_problem(args: argparse.Namespace, allowed: list[str]) -> str | None:
    """A one-line message for options that cannot work (counts below 1, a port outside 1-65535, device or dtype, a
    model name no folder can have or a model folder without config.json, a proxy setting that trusts every address:
    :data:`TRUSTS_EVERY_ADDRESS`), else None."""
    for flag, value in (("--cap", args.cap), ("--models-held", args.models_held), ("--max-rows", args.max_rows),
                        ("--queue-size", args.queue_size)):
        if value < 1:
            return f"{flag} must be at least 1, got {value}"
    if args.port is not None and not 1 <= args.port <= 65535:
        return f"--port must be a port number from 1 to 65535, got {args.port}"
    if not args.max_seconds > 0 or args.max_seconds == float("inf"):
        return f"--max-seconds must be a positive number of seconds, got {args.max_seconds}"
    if "*" in (h.strip() for h in os.environ.get("FORWARDED_ALLOW_IPS", "").split(",")):
        return TRUSTS_EVERY_ADDRESS
    if threads_problem(args.threads):
        return threads_problem(args.threads)
    problem = device_dtype_problem(args.device, args.dtype)
    if problem:
        return problem
    try:
        resolve_compile(args)
    except ValueError as error:
        return str(error)
    if args.compile and args.cache != "static":
        return "--compile (or PACKED_SS_COMPILE=1) needs the static cache: leave out --cache dynamic"
    for name in [args.model, *allowed]:
        try:
            local_folder(name)
        except ModelLoadError as error:
            return str(error)
    return None
