"""The serving layer: what a request needs apart from drawing it.

Settings validated into one frozen object (:mod:`serve.settings`), the model store (:mod:`serve.models`),
user sessions and step-through runs (:mod:`serve.sessions`, :mod:`serve.step`), the compute gate and row
budget (:mod:`serve.limits`), the GPU task wrapper (:mod:`serve.gpu`), full runs, races and calibration
(:mod:`serve.runs`, :mod:`serve.race`, :mod:`serve.lanes`, :mod:`serve.block_sizes`), the Benchmark tab's
work (:mod:`serve.benchmark`), the documented API (:mod:`serve.api`) and the request gate every HTTP request passes
(:mod:`serve.request_gate`, with :mod:`serve.address_shares`, :mod:`serve.request_checks`, :mod:`serve.raw_calls`,
:mod:`serve.asgi_io`; uploads: :mod:`serve.uploads`).

No decoding logic lives here: every token comes from :func:`packed_ss.engine.decode`; runs are timed by
:mod:`packed_ss.measure`. Nothing is a module-level mutable global: the app creates one
:class:`~serve.server.Server` per demo. Concurrency: each run gets its own :meth:`DualModeModel.share`
adapter (its own KV cache), each :class:`~serve.step.StepRun` has a lock, the model store loads a model at
most once, and every model iteration takes a turn at the :class:`~serve.limits.ComputeGate` (one at a
time, least work first). Every request's worst-case work is checked against a row budget before it runs.
Nothing here imports the UI (``components/``, ``tabs/``).
"""
