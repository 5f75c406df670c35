"""One app's serving state (:class:`Server`): what every tab's handlers and the API share.

The app creates one per demo (no module-level state): the model store, the compute gate, the GPU tasks,
the user sessions, the best-block-size finder, the timing log and the limits of one request.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from packed_ss.projection import CallTable, load_tables
from packed_ss.threads import ThreadTuner

from serve.admission import Admission
from serve.address_shares import CallListeners
from serve.block_sizes import BestBlockSizes
from serve.gpu import GpuTasks, has_spaces
from serve.limits import MAX_ROWS_PER_REQUEST, MAX_SECONDS_PER_REQUEST, ComputeGate, client_alive
from serve.models import DEFAULT_MODEL, ModelStore
from serve.sessions import Sessions, UserSession
from serve.settings import NEW_TOKENS_CAP, RequestValues, RunSettings
from serve.timing import TimingLog
from serve.uploads import SessionFiles


def client_address(request) -> str:
    """The client address behind a Gradio ``request`` ("" when it has none: a direct Python call)."""
    client = getattr(request, "client", None)
    return str(getattr(client, "host", "") or "")


class Server:
    """The serving state of one app.

    Args:
        model: default model folder or hub id. device, dtype, preloaded, allowed, models_held, family,
            drafter_lora, base_model: as :class:`~serve.models.ModelStore` takes them.
        max_rows: worst-case model rows one request may need (:mod:`serve.limits`); more is refused.
        max_seconds: predicted worst-case decoder seconds one request may take (None: no limit).
        cap: largest new-token limit a request may ask for.
        threads: torch threads per model call (``--threads``); None: measured at the first request and again when
            calls drift (:class:`packed_ss.threads.ThreadTuner`).
    Attributes:
        store, gate, tasks, sessions, best_sizes, log, admission, files: the shared parts (one each).
        eager: ZeroGPU (the ``spaces`` package): a step-through run is computed in one GPU call.
        blocks: the ``gr.Blocks`` once built (:meth:`alive` reads its queue); None before.
    """

    def __init__(self, model: str = DEFAULT_MODEL, *, device: str | None = None, dtype=None,
                 preloaded: dict | None = None, allowed: Sequence[str] = (), models_held: int = 2,
                 family: str | None = None, drafter_lora: str | None = None,
                 max_rows: int = MAX_ROWS_PER_REQUEST, cap: int = NEW_TOKENS_CAP,
                 max_seconds: float | None = MAX_SECONDS_PER_REQUEST, base_model: str | None = None,
                 cache: str = "static", compiled: bool | None = None, path: str = "auto", threads: int | None = None):
        if compiled is None and has_spaces():  # ZeroGPU: no recorded CUDA graph may outlive a request's GPU call
            compiled = False
        self.store = ModelStore(model, device=device, dtype=dtype, preloaded=preloaded, allowed=allowed,
                                capacity=models_held, family=family, drafter_lora=drafter_lora,
                                base_model=base_model, cache=cache, compiled=compiled, path=path)
        self.threads = ThreadTuner(fixed=threads)  # torch threads per call: measured (or --threads), per turn
        self.gate = ComputeGate(self.threads)  # one model iteration at a time, least work first
        self.tasks = GpuTasks(self.store, self.gate)  # the GPU work of each request (spaces.GPU on ZeroGPU)
        self.files = SessionFiles()  # each session's uploads and outputs, removed when it ends
        self.sessions = Sessions(on_forget=self.files.forget, holds=lambda key: self.files.count(key) > 0)
        self.best_sizes = BestBlockSizes()  # each schedule's best B per model, found once (race option)
        self.log = TimingLog()
        self.admission = Admission()  # at most a few heavy requests at once, one per visitor
        self.eager = has_spaces()
        self.max_rows = int(max_rows)
        self.max_seconds = None if max_seconds is None else float(max_seconds)
        self.cap = int(cap)
        self.drafter_lora = drafter_lora
        self.blocks = None
        self.listeners = CallListeners()  # which raw API calls somebody reads (the app's middleware notes them)

    @functools.cached_property
    def gpu_tables(self) -> list[CallTable]:
        """Call costs measured on a GPU, the race's projection (:func:`gpu_tables`): read at the first race."""
        return gpu_tables()

    def settings(self, values: RequestValues) -> RunSettings:
        """``values`` validated under this server's new-token cap. Raises: UserError."""
        return values.settings(cap=self.cap)

    def session(self, request) -> UserSession:
        """The state of the browser tab (or API client) behind a Gradio ``request``."""
        return self.sessions.get(request.session_hash, client_address(request))

    def admit(self, request, lower: str | None = "the new-token limit or the prompt length") -> Callable:
        """``predicted seconds -> context manager``: this request's heavy slot (:class:`Admission`); ``lower``
        names the settings of the asking tab that make a request lighter. One heavy request per client address
        (session hashes cost nothing, so one address could otherwise hold every slot); per session where a
        request has no address (a direct Python call)."""
        visitor = client_address(request) or getattr(request, "session_hash", None)
        return lambda seconds: self.admission.admit(visitor, seconds, lower)

    def alive(self, request) -> Callable[[], bool] | None:
        """A check that ``request``'s client is still connected (None: cannot tell, or ZeroGPU, where the
        work runs in another process)."""
        if self.eager or request is None or self.blocks is None:
            return None
        return client_alive(self.blocks, request.session_hash, self.listeners, getattr(request, "request", None))


GPU_TABLES = Path(__file__).resolve().parent.parent / "assets" / "gpu"  # scripts/gpu_check.py's JSON, shipped
PROJECTED = ("the embedded model, bfloat16", "a 1.34B NLD-shaped model, bfloat16")  # the race's projection columns


def gpu_tables(folder: Path = GPU_TABLES) -> list[CallTable]:
    """The per-call tables the race projects onto: of the newest ``scripts/gpu_check.py`` JSON in ``folder`` (by
    the date in its name), those of :data:`PROJECTED` found there. An unreadable file is one line on stderr and
    no projection; no file, no projection."""
    files = sorted(folder.glob("gpu_check-*.json"), key=lambda f: f.stem[-10:])
    if not files:
        return []
    try:
        tables = load_tables(files[-1])
    except (OSError, ValueError) as error:
        print(f"no GPU projection: {error}", file=sys.stderr, flush=True)
        return []
    return [table for name in PROJECTED for table in tables if table.model == name]
