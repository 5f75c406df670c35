"""Files a visitor sends or gets (uploads, the Benchmark tab's outputs, Step and Race downloads), tied to the session
that made them.

* :class:`SessionFiles` gives each session its own files: an upload (each in a folder of its own,
  :func:`own_paths`) is moved into a private folder of the first session that uses it; an output (the
  Benchmark tab's report, a Step or Race download, :mod:`serve.downloads`) is written to a folder of its own with a random name and registered to
  the session it was written for. Another session naming a copy or an output gets the same refusal as a path that
  does not exist, nothing is deleted on read, a session keeps at most
  :data:`FILES_PER_SESSION` files (its oldest go first; a download replaces the session's earlier one of its kind)
  and its files are removed when the session ends. The Benchmark tab takes a file only from
  the session's own upload event (:meth:`SessionFiles.choose`), so its API endpoints take no file at all.
* :class:`BoundUploads` (ASGI middleware) refuses an upload request of more than :data:`FILES_PER_UPLOAD` files, a
  file part without a name, and uploads beyond the bytes all visitors and one address may upload within minutes;
  it gives every stored file a path of its own (Gradio names an upload by its bytes, so two visitors sending the
  same file would share one path, and whether it was still there would tell one of the other).

Messages name files as the visitor gave them (their own names), never by a server path.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path

from packed_ss.inputs import shown

from serve.asgi_io import ArrivingBodies, declared_length, forward, receive_body, reply
from serve.request_checks import client_of
from serve.errors import UserError

FILES_PER_SESSION = 8  # uploads and outputs one session keeps (the oldest are removed first)
FILES_PER_UPLOAD = 4  # files one upload request may carry
UPLOAD_PATH = "/gradio_api/upload"
MAX_UPLOAD_BYTES = 2 * 2**20  # one file (app.MAX_UPLOAD); a request may carry FILES_PER_UPLOAD of them
UPLOAD_WITHIN_S = 30.0  # seconds an upload's whole body may take to arrive (a trickle held connections open)
UPLOAD_PREFIX = "upload-"  # the folder of its own each stored upload gets in Gradio's upload folder (own_paths)


def upload_folder() -> Path:
    """Gradio's upload folder (``GRADIO_TEMP_DIR`` or the system temp folder's ``gradio``), where uploads land."""
    from gradio.utils import get_upload_folder

    return Path(get_upload_folder()).resolve()


def given_path(value) -> str | None:
    """The path a raw file value names: Gradio's file object ``{"path": ...}`` or a text (None: no file).

    Raises: UserError for anything else (a number, a list, an object without a text ``path``)."""
    if value is None or value == "":
        return None
    path = value.get("path") if isinstance(value, dict) else value
    if not isinstance(path, str) or not path.strip():
        raise UserError(f"a file must be sent through the page (an uploaded file), got {type(value).__name__}")
    return path


class SessionFiles:
    """The files of each session (see the module docstring).

    Args:
        root: where sessions' private folders go (default: the system temp folder's ``packed-ss-sessions``).
        uploads: the folder uploads arrive in (default: Gradio's, :func:`upload_folder`).
        per_session: files one session keeps.
    """

    def __init__(self, root: str | Path | None = None, uploads: str | Path | None = None,
                 per_session: int = FILES_PER_SESSION):
        self.root = Path(root or Path(tempfile.gettempdir()) / "packed-ss-sessions")
        self._uploads = Path(uploads).resolve() if uploads is not None else None
        self.per_session = per_session
        self._files: dict[str, OrderedDict[str, Path]] = {}  # session -> {path it names: file on disk}
        self._owner: dict[str, str] = {}  # file on disk -> its session
        self._folders: dict[str, Path] = {}
        self._slots: dict[str, dict[str, Path]] = {}  # session -> {widget: its file}
        self._numbers = itertools.count()
        self._lock = threading.Lock()

    @property
    def uploads(self) -> Path:
        return self._uploads or upload_folder()

    def open(self, session: str, value) -> Path | None:
        """The file ``value`` names for ``session``: its own earlier upload or output, or a new upload (copied into
        the session's folder on first use). None when ``value`` names no file.

        An upload (a file in a folder :func:`own_paths` made for it alone) is taken by the first session naming
        it: moved into that session's folder. Anything else (another session's copy or output, Gradio's
        hash-named files, any other server path, a path that does not exist, an upload another session took) gets
        the same refusal: a visitor learns nothing of another's files.

        Raises: UserError for a value that is no file, or one that is neither an upload nor the session's own; the
            message names the file by its own name.
        """
        path = given_path(value)
        if path is None:
            return None
        name = Path(path).name or "the file"
        with self._lock:
            given = self._resolved(path)
            mine = self._files.get(session, {})
            if given in mine:  # its own upload, named again (the original is gone by now)
                return mine[given]
            key = given if given is not None and _is_file(given) else None
            if key is not None and self._owner.get(key) == session:
                return Path(key)
            if key is None or key in self._owner or not self._is_upload(Path(key)):
                raise UserError(f"{name!r} is not a file you uploaded in this session: upload it again")
            private = self._folder(session) / str(next(self._numbers)) / name  # its own name, for messages
            try:
                private.parent.mkdir()
                shutil.move(key, private)
            except OSError:
                raise UserError(f"{name!r} is no longer on the server: upload it again") from None
            try:
                Path(key).parent.rmdir()  # the upload's own folder (own_paths), empty now
            except OSError:  # something else is there too
                pass
            self._keep(session, key, private)
            return private

    def choose(self, session: str, slot: str, value) -> Path | None:
        """Open ``value`` for ``session`` (:meth:`open`) and keep it as the session's file for ``slot`` (the file a
        widget holds: "summary", "prompts"); None clears the slot. Returns the file. Raises: UserError as open."""
        path = self.open(session, value)
        with self._lock:
            slots = self._slots.setdefault(session, {})
            if path is None:
                slots.pop(slot, None)
            else:
                slots[slot] = path
        return path

    def chosen(self, session: str, slot: str) -> Path | None:
        """The file ``session`` keeps for ``slot``, while it is still the session's (None: none, or removed)."""
        with self._lock:
            path = self._slots.get(session, {}).get(slot)
            return path if path is not None and self._owner.get(str(path)) == session else None

    def publish(self, session: str, name: str, data: bytes | str | Path, slot: str | None = None) -> str:
        """Write ``data`` (bytes, or the file at a path) as file ``name`` where the page serves files from, in a
        folder of its own with a random name (never shared with another session's file of the same bytes), and
        register it as ``session``'s (see :meth:`add_output`). Returns the served path.

        Raises: OSError when it cannot be written (the caller says so in one line)."""
        folder = self.uploads / f"out-{secrets.token_hex(16)}"
        folder.mkdir(parents=True)
        target = folder / Path(name).name
        try:
            if isinstance(data, bytes):
                target.write_bytes(data)
            else:
                shutil.copyfile(data, target)
        except OSError:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self.add_output(session, target, slot)
        return str(target)

    def add_output(self, session: str, path: str | Path, slot: str | None = None) -> None:
        """Register ``path`` (a file written for ``session``, e.g. a benchmark report) as that session's. With a
        ``slot`` (a kind of file: "step-records", "race-table"...), it replaces the session's earlier file of that
        slot, which is removed: exporting again does not pile up files (nor push the session's uploads out)."""
        key = self._resolved(str(path)) or str(path)
        with self._lock:
            if slot is not None:
                slots = self._slots.setdefault(session, {})
                earlier = slots.get(slot)
                if earlier is not None and str(earlier) != key:
                    self._drop(session, earlier)
                slots[slot] = Path(key)
            self._keep(session, key, Path(key))

    def forget(self, session: str) -> None:
        """Remove every file of ``session`` (its copies of uploads, its outputs) and its folder: the session ended."""
        with self._lock:
            files = self._files.pop(session, {})
            folder = self._folders.pop(session, None)
            self._slots.pop(session, None)
            for disk in files.values():
                if self._owner.get(str(disk)) == session:
                    del self._owner[str(disk)]
        for disk in files.values():
            _remove(disk)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def count(self, session: str) -> int:
        """Files ``session`` holds now."""
        with self._lock:
            return len(self._files.get(session, {}))

    # --- inside the lock ---------------------------------------------------------------------------------
    def _keep(self, session: str, given: str, disk: Path) -> None:
        files = self._files.setdefault(session, OrderedDict())
        files[given] = disk
        self._owner[str(disk)] = session
        folder = self._folders.get(session)  # its uploads are there; its outputs in folders of their own
        chosen = {d for d in self._slots.get(session, {}).values() if folder is not None and folder in d.parents}
        while len(files) > self.per_session:  # the oldest file goes first, not an upload a widget holds
            given = next((g for g, d in files.items() if d not in chosen), None)
            if given is None:
                break
            old = files.pop(given)
            self._owner.pop(str(old), None)
            _remove(old)

    def _drop(self, session: str, disk: Path) -> None:
        """Remove ``disk``, one of ``session``'s files, from its files and from the disk."""
        files = self._files.get(session, {})
        for given in [g for g, d in files.items() if d == disk]:
            del files[given]
        if self._owner.get(str(disk)) == session:
            del self._owner[str(disk)]
            _remove(disk)

    def _folder(self, session: str) -> Path:
        if session not in self._folders:
            self.root.mkdir(parents=True, exist_ok=True)
            self._folders[session] = Path(tempfile.mkdtemp(prefix="session-", dir=self.root))
        return self._folders[session]

    def _resolved(self, path: str) -> str | None:
        """``path`` resolved, whether a file is there or not (None: no name a file can have)."""
        try:
            return str(Path(path).resolve())
        except (OSError, ValueError, RuntimeError):
            return None

    def _is_upload(self, path: Path) -> bool:
        """Whether ``path`` is a visitor's upload: a file in a folder of its own that :func:`own_paths` made in
        Gradio's upload folder (not Gradio's hash-named original, not an output :meth:`publish` wrote there)."""
        return path.parent.parent == self.uploads and path.parent.name.startswith(UPLOAD_PREFIX)


def _is_file(path: str) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL
        return False


def _remove(disk: Path) -> None:
    """Delete ``disk``, and its folder when :meth:`SessionFiles.publish` made it for this one file."""
    disk.unlink(missing_ok=True)
    if disk.parent.name.startswith("out-"):
        shutil.rmtree(disk.parent, ignore_errors=True)


RECENT_UPLOAD_BYTES = 256 * 2**20  # bytes all visitors may upload within RECENT_S (uploads nobody uses stay that long)
CLIENT_UPLOAD_BYTES = 16 * 2**20  # bytes one client address may upload within RECENT_S (a 16th of all)
RECENT_S = 900.0  # seconds an unused upload stays on disk (app.UNUSED_FILES_S)


class BoundUploads:
    """ASGI middleware: an upload request (``POST /gradio_api/upload``) carrying more than ``max_files`` files, or
    more bytes than that many files may have, is refused in one line (413) before Gradio stores any of them; so is
    an upload once ``client_bytes`` have been uploaded from its client's address, or ``recent_bytes`` from all,
    within ``recent_s`` seconds (429: the disk holds unused uploads that long, so this bounds what they can fill).

    Only uploads Gradio stores count (its answer is 200): a refused one (a file over the size limit) costs nobody
    anything, and one client's uploads leave the others' budget open. What the headers tell is checked before a byte
    of the body is read (the boundary; the Content-Length against the size limit and the address's budget); while
    the body arrives it holds what ``bodies`` (:class:`serve.asgi_io.ArrivingBodies`, shared with the request gate)
    allows, and it must be whole ``within_s`` seconds after its start (408).

    Each stored file is given a path of its own (:func:`own_paths`): Gradio names an upload by its bytes, so two
    visitors sending the same file would otherwise share one path, and one's use of it would tell the other."""

    def __init__(self, app, max_files: int = FILES_PER_UPLOAD, max_file_bytes: int = MAX_UPLOAD_BYTES,
                 recent_bytes: int = RECENT_UPLOAD_BYTES, recent_s: float = RECENT_S,
                 client_bytes: int = CLIENT_UPLOAD_BYTES, uploads: str | Path | None = None,
                 within_s: float = UPLOAD_WITHIN_S, bodies: ArrivingBodies | None = None):
        self.app = app
        self.bodies = bodies if bodies is not None else ArrivingBodies()  # what bodies may hold while they arrive
        self.within_s = within_s  # a body trickled in slower than this holds a connection: 408
        self.max_files = max_files
        self.max_bytes = max_files * max_file_bytes + 64 * 1024  # room for the parts' headers
        self.recent_bytes, self.recent_s, self.client_bytes = recent_bytes, recent_s, client_bytes
        self._recent: deque[list] = deque()  # [monotonic time, bytes, client] of the recent uploads
        self._one_at_a_time = asyncio.Lock()
        self.folder = uploads  # where uploads land (None: Gradio's, upload_folder())

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or scope.get("method") != "POST" or \
                not scope.get("path", "").rstrip("/").endswith(UPLOAD_PATH):
            await self.app(scope, receive, send)
            return
        boundary, why = boundary_of(scope)
        if boundary is None:
            await reply(send, 400, {"error": why}, close=True)
            return
        client = client_of(scope)
        declared = declared_length(scope)
        if declared is not None and declared <= self.max_bytes and not self._fits(declared, client):
            await reply(send, 429, {"error": self._over_budget()}, close=True)  # before a byte of it is read
            return
        body = await receive_body(scope, receive, send, self.max_bytes, self.bodies,
                                  too_big=f"an upload may carry at most {self.max_files} files of "
                                          f"{MAX_UPLOAD_BYTES // 2**20} MB",
                                  too_slow=f"an upload must arrive whole within {self.within_s:g} s of its start: "
                                           f"send the file at once", within_s=self.within_s)
        if body is None:
            return
        parts = body.count(b"--" + boundary) - 1
        if parts > self.max_files:
            await reply(send, 413, {"error": f"an upload may carry at most {self.max_files} files, got {parts}"})
            return
        problem = part_problem(body, boundary, charset_of(scope))
        if problem is not None:
            await reply(send, 400, {"error": problem})
            return
        entry = self._reserve(len(body), client)
        if entry is None:
            await reply(send, 429, {"error": self._over_budget()})
            return
        answer: list[dict] = []

        async def keeping(message):
            answer.append(message)

        stored = False
        try:
            async with self._one_at_a_time:  # Gradio's file and its own copies are made before the next upload
                await forward(self.app, scope, body, receive, keeping)
                start = next((m for m in answer if m.get("type") == "http.response.start"), {})
                stored = start.get("status") == 200
                if stored:
                    answer = own_paths(answer, self.folder, _gradio_uploads(scope))
        finally:
            if not stored:  # refused or failed: it holds nothing on disk
                self._release(entry)
        for message in answer:
            await send(message)

    def _over_budget(self) -> str:
        return (f"the server holds {self.recent_bytes // 2**20} MB of recent uploads ({self.client_bytes // 2**20} MB "
                f"from one address): try again in a few minutes")

    def _fits(self, size: int, client: str) -> bool:
        """Whether ``size`` more bytes from ``client`` fit in both budgets now."""
        now = time.monotonic()
        while self._recent and now - self._recent[0][0] > self.recent_s:
            self._recent.popleft()
        total = sum(n for _, n, _ in self._recent)
        mine = sum(n for _, n, who in self._recent if who == client)
        return total + size <= self.recent_bytes and mine + size <= self.client_bytes

    def _reserve(self, size: int, client: str) -> list | None:
        """Note ``size`` bytes from ``client`` when they fit in both budgets (their entry); None when not."""
        if not self._fits(size, client):
            return None
        entry = [time.monotonic(), size, client]
        self._recent.append(entry)
        return entry

    def _release(self, entry: list) -> None:
        try:
            self._recent.remove(entry)
        except ValueError:  # aged out meanwhile
            pass


def own_paths(answer: list[dict], uploads: str | Path | None = None, known: set | None = None) -> list[dict]:
    """Gradio's answer to an upload (its messages: a JSON list of the stored files' paths) with each file moved to a
    folder of its own (``upload-<random>/<its name>``) and the answer naming those paths instead.

    Gradio stores an upload at ``<its bytes' hash>/<its name>``, so the same bytes sent twice share one path; after
    this, no two uploads do, and the hash-named file is gone (one request at a time: see :class:`BoundUploads`).
    ``known``: Gradio's set of uploaded files (``blocks.upload_file_set``, which its ``delete_cache`` clears of files
    older than its age), given the new paths in place of the old. An answer of another shape is returned unchanged."""
    body = b"".join(m.get("body", b"") for m in answer if m.get("type") == "http.response.body")
    try:
        paths = json.loads(body)
    except ValueError:
        return answer
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        return answer
    root = (Path(uploads) if uploads is not None else upload_folder()).resolve()
    given, originals = [], set()
    for path in paths:
        original = Path(path).resolve()
        if root not in original.parents or not original.is_file():
            return answer
        own = Path(tempfile.mkdtemp(prefix=UPLOAD_PREFIX, dir=root)) / original.name
        try:
            os.link(original, own)
        except OSError:  # a file system without hard links
            shutil.copyfile(original, own)
        given.append(str(own))
        originals.add(original)
    if known is not None:
        known.difference_update(paths)
        known.update(given)
    for original in originals:
        original.unlink(missing_ok=True)
        try:
            original.parent.rmdir()
        except OSError:  # not empty
            pass
    data = json.dumps(given).encode()
    start = next(m for m in answer if m.get("type") == "http.response.start")
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
    return [{**start, "headers": [*headers, (b"content-length", str(len(data)).encode())]},
            {"type": "http.response.body", "body": data, "more_body": False}]


def _gradio_uploads(scope) -> set | None:
    """The running Gradio app's set of uploaded files (None outside one)."""
    try:
        return scope["app"].get_blocks().upload_file_set
    except (KeyError, AttributeError, TypeError, ValueError):
        return None


MAX_BOUNDARY = 256  # the longest multipart boundary Gradio's parser (python-multipart) takes


def part_problem(body: bytes, boundary: bytes, charset: bytes | None = None) -> str | None:
    """Why Gradio's upload route would fail on a multipart ``body`` after storing some of its files (kept on disk
    and counted nowhere), or keep a file it does not answer with, or None. The body is read with the parser Gradio
    reads it with (python-multipart's ``MultipartParser``, its headers gathered as Gradio's ``GradioMultiPartParser``
    gathers them), so that the check and the upload cannot see different parts: a hand-made reading took the first
    of two ``Content-Disposition`` headers where Gradio keeps the last (issue 35).

    Refused: a body the parser cannot read, or one whose last part or closing delimiter never ends; a part with
    more or fewer than one ``Content-Disposition`` header; a part not named ``files`` (Gradio keeps the others'
    files as temporary files and moves none of them); a part with no plain file name (none, an empty one, or only
    the extended form ``filename*=``); a file name Gradio refuses to store (``..``, checked with Gradio's own
    ``strip_invalid_filename_characters`` and ``safe_join``); a ``charset`` other than UTF-8 (``charset``: the
    request's, from its Content-Type; file names are decoded with it)."""
    from gradio.route_utils import _user_safe_decode  # how Gradio decodes a file name
    from gradio.utils import DeveloperPath, InvalidPathError, UserProvidedPath, safe_join
    from gradio_client.utils import strip_invalid_filename_characters
    from python_multipart.exceptions import MultipartParseError
    from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

    if charset is not None and charset.lower().replace(b"-", b"") != b"utf8":
        return "an upload's file names are sent in UTF-8 (no other charset)"
    parts: list[dict] = []
    header = {"name": b"", "value": b""}

    def on_header_end() -> None:
        parts[-1]["headers"].append((header["name"].lower(), header["value"]))
        header["name"] = header["value"] = b""

    callbacks = {
        "on_part_begin": lambda: parts.append({"headers": [], "ended": False}),
        "on_header_field": lambda data, start, end: header.__setitem__("name", header["name"] + data[start:end]),
        "on_header_value": lambda data, start, end: header.__setitem__("value", header["value"] + data[start:end]),
        "on_header_end": on_header_end,
        "on_part_end": lambda: parts[-1].__setitem__("ended", True),
    }
    parser = MultipartParser(boundary, callbacks)
    try:
        parser.write(body)
        parser.finalize()
    except (MultipartParseError, ValueError) as error:
        return f"an upload's body cannot be read as multipart/form-data ({shown(str(error), 80)})"
    if parser.state != MultipartState.END or not all(part["ended"] for part in parts):
        return "an upload's body ends with its closing boundary (CRLF --BOUNDARY--): send the whole request"
    for part in parts:
        dispositions = [value for name, value in part["headers"] if name == b"content-disposition"]
        if len(dispositions) != 1:
            return (f"each part of an upload has one Content-Disposition header (a part has "
                    f"{len(dispositions)})")
        _, options = parse_options_header(dispositions[0])
        if not options.get(b"filename") or not options.get(b"name"):
            return ("an uploaded file has no name: send each file as a part named \"files\" with its file name "
                    "(name=\"files\"; filename=\"...\")")
        if options[b"name"] != b"files":
            named = shown(options[b"name"].decode("latin-1"), 40)
            return f"an upload's parts are named \"files\" (one is named {named})"
        name = strip_invalid_filename_characters(Path(_user_safe_decode(options[b"filename"], "utf-8")).name)
        try:
            safe_join(DeveloperPath("/uploads"), UserProvidedPath(name))
        except InvalidPathError:
            return f"an uploaded file's name cannot be stored: {shown(name, 40)}"
    return None


def content_type(scope) -> tuple[bytes, dict]:
    """A request's first Content-Type header parsed as Gradio parses it (python-multipart's
    ``parse_options_header``): (its type, its parameters)."""
    from python_multipart.multipart import parse_options_header

    header = next((value for key, value in scope.get("headers", []) if key.lower() == b"content-type"), b"")
    return parse_options_header(header)


def charset_of(scope) -> bytes | None:
    """The ``charset`` parameter of a request's Content-Type (None: none given)."""
    return content_type(scope)[1].get(b"charset")


def boundary_of(scope) -> tuple[bytes | None, str | None]:
    """(the multipart boundary of a request, None) or (None, why there is none usable), from its Content-Type."""
    kind, options = content_type(scope)
    if kind != b"multipart/form-data":
        return None, "an upload is sent as multipart/form-data"
    boundary = options.get(b"boundary", b"")
    if not boundary or len(boundary) > MAX_BOUNDARY:
        return None, f"an upload's Content-Type needs a multipart boundary of 1 to {MAX_BOUNDARY} characters"
    return boundary, None
