"""The models a server offers (:class:`ModelStore`): loaded on first use, at most a few held, never one the
operator did not offer; :func:`warm_up` right after loading."""

from __future__ import annotations

import re
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path

from packed_ss.config import DecodeConfig
from packed_ss.inputs import model_name, shown
from packed_ss.measure import warm_up as warm_up_runs

from serve.errors import UserError
from serve.settings import RequestValues


DEFAULT_MODEL = str(Path(__file__).resolve().parents[1] / "assets" / "model")


# The shipped any-order model (Appendix C), offered beside the default when the operator names no others.
ANY_ORDER_MODEL = str(Path(__file__).resolve().parents[1] / "assets" / "model-anyorder")


# An absolute path in a message (not part of a URL): its folders are the server's business, its last name is not.
SERVER_PATH = re.compile(r"(?<![\w:/.~-])/(?:[^\s'\",;()/]+/)+([^\s'\",;()/]+)")


def hide_paths(message: str, identity: str, public: str) -> str:
    """``message`` as a visitor may see it: the model's own folder written as its public name, any other absolute
    path as ``…/`` and its last name (a visitor never learns the server's folders)."""
    if Path(identity).is_absolute():
        message = message.replace(identity, public)
    return SERVER_PATH.sub(lambda m: "…/" + m.group(1), message)


def has_chat_template_file(name: str) -> bool:
    """Whether a folder or a cached hub id carries a chat template (``chat_template.jinja``, or a
    ``chat_template`` entry in ``tokenizer_config.json``), read from disk only."""
    import json

    def local(file: str) -> Path | None:
        folder = Path(name).expanduser()
        if folder.is_dir():
            return folder / file if (folder / file).is_file() else None
        try:
            from huggingface_hub import hf_hub_download

            return Path(hf_hub_download(name, file, local_files_only=True))
        except Exception:  # noqa: BLE001 - not cached, not a hub id: unknown
            return None

    if local("chat_template.jinja") is not None:
        return True
    config = local("tokenizer_config.json")
    try:
        return bool(config and json.loads(config.read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


class ModelStore:
    """The models a server offers, loaded on first use, keyed by their resolved identity, at most
    ``capacity`` held at once (least recently used dropped).

    Visitors choose among ``allowed`` models only (default: the default model and any preloaded one),
    never an arbitrary folder or hub id, so nobody can make the server download or hold models the
    operator did not offer. Every spelling of a folder (``./m``, ``m/``, ``m//``) is one model.

    Args:
        default: folder or hub id used for an empty model name.
        device, dtype: passed to :meth:`DualModeModel.from_pretrained` (default: CUDA when present;
            float32 on CPU).
        preloaded: already loaded models by name (tests inject theirs here); they are offered too.
        allowed: further folders or hub ids visitors may choose.
        capacity: models held in memory at once (>= 1).
        family: force a model family for every model (default: detected per model).
        drafter_lora: drafter adapter (path, or subfolder such as ``linear_spec_lora``) attached to every
            model that has it; the others load without one.
        base_model: SetDLM checkpoints' base model (a local copy of its config.json, for a server that cannot
            reach the hub); the other families ignore it.
        cache, compiled, path: the KV cache kind, compiled calls and whose forward runs them (``--cache``,
            ``--compile``, ``--path``) of every model loaded; a model the native forward cannot serve under
            ``path="auto"`` gets one line in the server's log saying why. ``compiled=None``: CUDA graphs where the
            native forward runs a CUDA model, else eager calls (:meth:`DualModeModel.from_pretrained`).
    """

    def __init__(self, default: str = DEFAULT_MODEL, device: str | None = None, dtype=None,
                 preloaded: dict | None = None, allowed: Sequence[str] = (), capacity: int = 2,
                 family: str | None = None, drafter_lora: str | None = None, base_model: str | None = None,
                 cache: str = "static", compiled: bool | None = None, path: str = "auto"):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.default = str(default)
        self.device = device
        self.dtype = dtype
        self.capacity = capacity
        self.family = family
        self.drafter_lora = drafter_lora
        self.base_model = base_model
        self.cache, self.compiled, self.path = cache, compiled, path
        self._models: OrderedDict[tuple[str, str], object] = OrderedDict(
            ((self.identity(name), str(dtype or "")), model) for name, model in (preloaded or {}).items())
        names = [self.default, *(preloaded or {}), *allowed]
        self._offered: dict[str, str] = {}  # identity -> name as the operator gave it
        for name in names:
            self._offered.setdefault(self.identity(name), str(name))
        self._public: dict[str, str] = {}  # public name -> identity (what the page, the API and messages show)
        for identity, given in self._offered.items():
            self._public[self._public_name(identity, given)] = identity
        # Display strings by model object, kept while it lives: a Step's model outlives its place in the store, and
        # a key by id() was met again by another checkpoint's model at the freed one's address.
        self._strings: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # What the models dropped had compiled (packed_ss.models.native.compiled_parts), by (identity, dtype, their
        # weight files): a reload adopts it instead of compiling again. At most one entry per offered model and dtype.
        self._compiled: dict[tuple, tuple] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        # The server's compute gate (serve.limits.ComputeGate), set by serve.gpu.GpuTasks: a loaded model's warm-up records
        # CUDA graphs, and nothing else may compute while a graph is captured, so its iterations take turns there.
        self.gate = None

    @property
    def calls(self) -> str:
        """What runs the models' decode and speculative calls: ``"compiled"`` (``--compile``), ``"CUDA graphs"``
        (the default on a CUDA device, where the native forward serves the model) or ``"eager"``."""
        if self.compiled:
            return "compiled"
        import torch

        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        native_path = self.path != "transformers" and self.cache == "static"
        if self.compiled is None and native_path and str(device).startswith("cuda"):
            return "CUDA graphs"
        return "eager"

    @staticmethod
    def identity(name: str) -> str:
        """One key per model: a local folder's resolved absolute path, else the hub id as given."""
        name = str(name).strip()
        local = Path(name).expanduser()
        try:
            is_local = name.startswith((".", "/", "~")) or local.exists()
            return str(local.resolve()) if is_local else name
        except (OSError, ValueError):  # too long for a file name, a NUL byte: not a folder this server has
            return name

    def _public_name(self, identity: str, given: str) -> str:
        """How visitors see a model: a hub id as given, a folder inside the project relative to it, any other
        folder by its own name only (never a server path); made unique with " (2)", " (3)"..."""
        name = model_name(identity) if Path(identity).is_absolute() else given
        if Path(name).is_absolute():
            name = Path(name).name
        base, k = name, 2
        while name in self._public:
            name, k = f"{base} ({k})", k + 1
        return name

    @property
    def offered(self) -> list[str]:
        """The models visitors may choose, by their public names (the default first); :meth:`resolve` takes
        these as well as the operator's own spellings."""
        return list(self._public)

    def offered_name(self, identity: str) -> str:
        """A model's public name (see :meth:`offered`)."""
        return next((name for name, key in self._public.items() if key == identity), model_name(identity))

    def resolve(self, name: str | None) -> str:
        """The identity of a model name (empty = the default model).

        Raises: UserError when the model is not one this server offers.
        """
        name = (name or "").strip() or self.default
        if name in self._public:
            return self._public[name]
        key = self.identity(name)
        if key not in self._offered:
            raise UserError(f"model {shown(name)} is not offered on this server; choose one of: "
                            f"{', '.join(repr(n) for n in self.offered)}")
        return key

    def any_order(self, name: str | None) -> bool:
        """Whether an offered model is an any-order one (paper Appendix C), without loading it: a loaded
        model's own flag, else its ``config.json`` (``any_order: true``, or a SetDLM checkpoint), read from the
        folder or the local hub cache, never the network. False for anything else (a hub id not cached yet,
        a model not offered, an unreadable config)."""
        from packed_ss.models.families import read_config, says_any_order

        return self._peek(name, "any_order", lambda key: says_any_order(read_config(key, local_only=True)))

    def chat_template(self, name: str | None) -> bool:
        """Whether an offered model's tokenizer has a chat template, without loading it: a loaded model's own
        tokenizer, else its ``tokenizer_config.json`` (``chat_template``) or ``chat_template.jinja`` from the
        folder or the local hub cache, never the network. False when unknown."""
        return self._peek(name, "has_chat_template", has_chat_template_file)

    def _peek(self, name: str | None, attribute: str, on_disk: Callable[[str], bool]) -> bool:
        """A yes/no fact of an offered model without loading it: the loaded model's ``attribute``, else
        ``on_disk(identity)``; False for a model not offered or a file that cannot be read."""
        try:
            key = self.resolve(name)
        except (UserError, OSError, ValueError):
            return False
        with self._lock:
            loaded = [model for (identity, _), model in self._models.items() if identity == key]
        if loaded:
            return bool(getattr(loaded[0], attribute, False))
        try:
            return bool(on_disk(key))
        except (OSError, ValueError):  # ModelLoadError included
            return False

    def get(self, name: str | None, precision: str = ""):
        """The loaded :class:`DualModeModel` for ``name`` in ``precision`` ("" = the server's dtype); loads
        it on first use (each precision is a model of its own, counted against ``capacity``). The weight files are
        read (or downloaded) first, beside other visitors' calls; the load itself takes a turn of the compute gate
        (:meth:`_turn`), and loads in several threads run one at a time.

        Raises: UserError for a model not offered; ModelLoadError (a ValueError) with a readable message
        when loading fails.
        """
        from packed_ss.models import DualModeModel

        dtype = precision or self.dtype
        key = (self.resolve(name), str(dtype or ""))
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                if key in self._models:
                    return self._models[key]
            fetch_weights(key[0])  # the slow part, beside other visitors' calls: the files, into the local caches
            try:
                with self._turn():
                    model = DualModeModel.from_pretrained(key[0], device=self.device, dtype=dtype, family=self.family,
                                                          drafter_lora=self.drafter_lora, require_adapter=False,
                                                          base_model=self.base_model, cache=self.cache,
                                                          compiled=self.compiled, path=self.path)
            except ValueError as error:  # ModelLoadError included: its message without the server's paths
                raise type(error)(hide_paths(str(error), key[0], self.offered_name(key[0]))) from None
            if model.path_note:
                print(f"note: {self.offered_name(key[0])}: {model.path_note}", file=sys.stderr)
            with self._lock:
                kept = self._compiled.get((*key, weight_files(key[0])))
            if kept is not None:
                model.adopt_compiled(kept)
            warm_up(model, self._isolate(model))
            with self._lock:
                self._models[key] = model
                while len(self._models) > self.capacity:
                    old, dropped = self._models.popitem(last=False)
                    parts = dropped.compiled_parts() if hasattr(dropped, "compiled_parts") else None
                    if parts is not None:
                        self._compiled[(*old, weight_files(old[0]))] = parts
            return model

    def _turn(self):
        """What a load runs in: a turn of the compute gate (none without a gate, or in a thread holding one already).
        transformers sets torch's default dtype, one per process, to the loaded model's while it builds the network
        (:mod:`packed_ss.models.process_state`), so no other visitor's iteration computes meanwhile."""
        if self.gate is None or self.gate.holder == threading.get_native_id():
            return nullcontext()
        return self.gate.turn(0.0)

    def _isolate(self, model):
        """How ``model``'s warm-up iterations run: each a turn of the compute gate where its calls record CUDA graphs
        (a capture beside another visitor's call fails both), else freely (a CPU's compiling stays off the gate)."""
        if self.gate is None or not getattr(model, "graphs", False) or self.gate.holder == threading.get_native_id():
            return None  # no gate, no graphs, or this thread's turn already holds the gate
        from serve.limits import gated

        return lambda records: gated(records, self.gate, 0.0)

    def strings_for(self, model) -> Callable[[Sequence[int]], list[str]]:
        """A memoised ``ids -> display strings`` function for ``model`` (one decode per distinct id, kept while
        ``model`` lives)."""
        with self._lock:
            memo = self._strings.setdefault(model, {})

        def strings(ids: Sequence[int]) -> list[str]:
            missing = [i for i in dict.fromkeys(ids) if i not in memo]
            if missing:
                for i, s in zip(missing, model.token_strings(missing)):
                    memo[i] = s
            return [memo[i] for i in ids]

        return strings

    def loaded(self) -> list[str]:
        """Identities of the models held now (one entry per precision held)."""
        with self._lock:
            return [identity for identity, _ in self._models]


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")  # the files of a model folder that hold its weights
READ_CHUNK = 1 << 24  # bytes read at once by fetch_weights
SHARD_INDEX = "model.safetensors.index.json"  # a sharded checkpoint's list of its weight files


def fetch_weights(identity: str) -> None:
    """Bring a model's weight files near before its load: a local folder's read once (the load, at the compute gate,
    then finds them in the page cache), a hub id's downloaded into the hub cache as transformers names them (the
    shards of ``model.safetensors.index.json``, else ``model.safetensors``; the network only for files not cached).
    Nothing is raised: a file that cannot be had now is the load's to report."""
    folder = Path(identity)
    if folder.is_absolute():
        for path in sorted(p for p in folder.glob("*") if p.suffix in WEIGHT_SUFFIXES):
            try:
                with open(path, "rb", buffering=0) as file:
                    while file.read(READ_CHUNK):
                        pass
            except OSError:
                pass
        return
    import json

    from huggingface_hub import hf_hub_download

    def fetched(name: str, network: bool) -> Path | None:
        try:
            return Path(hf_hub_download(identity, name, local_files_only=not network))
        except Exception:  # noqa: BLE001 - not cached, not there, unreachable: the load says what
            return None

    index = fetched(SHARD_INDEX, False)
    if index is None and fetched("model.safetensors", False) is None:  # nothing cached: ask the hub
        index = fetched(SHARD_INDEX, True)
        if index is None:
            fetched("model.safetensors", True)
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())) if index else []
    except (OSError, ValueError, KeyError, AttributeError):
        shards = []
    for name in shards:
        if fetched(name, False) is None:
            fetched(name, True)


def weight_files(identity: str) -> tuple:
    """``(name, size, modification time)`` of a local model folder's weight files, sorted (a reload of a folder
    whose weights changed is another checkpoint); ``()`` for a hub id or an unreadable folder."""
    folder = Path(identity)
    try:
        return tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()
                            if p.suffix in WEIGHT_SUFFIXES))
    except OSError:
        return ()


def warm_up(model, isolate=None) -> None:
    """A few untimed calls right after loading (AR and Packed-SS, a handful of tokens), so that one-off
    first-call costs (allocations, kernel choice) do not land in the first visitor's timings or the
    cost fit. ``isolate`` wraps each run's iterations (:func:`packed_ss.measure.timed_run`; a server's compute gate
    where the calls record CUDA graphs)."""
    never = set(model.never_emit_ids)
    ids = [t for t in range(1, min(256, model.vocab_size)) if t not in never][:8]
    config = DecodeConfig(block_size=4, max_new_tokens=4)
    warm_up_runs(model.share(), ids, [(schedule, config) for schedule in ("ar", "packed")], isolate)
    if getattr(model, "compiled", False) and not model.any_order:  # the default settings' shapes, compiled now
        config = DecodeConfig(block_size=int(RequestValues.block_size), max_new_tokens=int(RequestValues.max_new_tokens))
        warm_up_runs(model.share(), ids, [(schedule, config) for schedule in ("ar", "linear", "quadratic", "packed")],
                     isolate)
