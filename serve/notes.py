"""What the visitor is looking at, said where the text appears: a note on the model (:func:`model_note`).

The shipped models are tiny demos whose text is not meant to make sense; a visitor who is not told so
assumes the app is broken. For any other model the note says what it is (family, size, dtype, device).
"""

from __future__ import annotations

from serve.models import ANY_ORDER_MODEL, DEFAULT_MODEL, ModelStore

TRAINED = {  # what the shipped models were trained on (their model cards, assets/*/README.md)
    DEFAULT_MODEL: "trained for a few CPU-hours on the Python standard library",
    ANY_ORDER_MODEL: "the embedded model trained 1,500 more steps for any-order decoding (paper Appendix C)",
}
REAL_CHECKPOINT = ("For meaningful text, start the app with a real dual-mode checkpoint on a GPU: "
                   "python app.py --model nvidia/Nemotron-Labs-Diffusion-3B.")


def parameters(model) -> int:
    """Parameters of a loaded model's network (0 when it has none, e.g. a scripted test model); counted once
    and kept on the network (every Step shows the note), as :func:`packed_ss.cost.call_cost` keeps its fit."""
    network = getattr(model, "model", None)
    count = getattr(network, "parameter_count", None)
    if count is None:
        try:
            count = sum(p.numel() for p in network.parameters())
            network.parameter_count = count
        except (AttributeError, TypeError):
            return 0
    return count


def count_text(n: int) -> str:
    """``5_512_000 -> "5.5M"``, ``3_000_000_000 -> "3.0B"``, ``900 -> "900"``."""
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def model_note(store: ModelStore, name: str | None, model) -> str:
    """One or two sentences on ``model`` (the loaded model of ``name``, as offered by ``store``): for a
    shipped demo model what it is, that its text is not meant to make sense and how to load a real one;
    otherwise its family, parameters, dtype and device."""
    identity = store.resolve(name)
    size = count_text(parameters(model))
    dtype = str(getattr(model, "dtype", "")).removeprefix("torch.")
    device = getattr(getattr(model, "device", None), "type", "cpu")
    if identity in TRAINED:
        return (f"Model: the project's embedded demo model ({size} parameters, {TRAINED[identity]}). Its text looks "
                f"like Python but is not meant to make sense: it is here so that the schedules, masks and timings "
                f"can be watched on any machine. {REAL_CHECKPOINT}")
    family = getattr(model, "family", "plain")
    kind = "an any-order" if getattr(model, "any_order", False) else "a dual-mode"
    return (f"Model: {store.offered_name(identity)}, {kind} {family}-family model, {size} parameters, {dtype} on "
            f"{device}.")


def forward_note(model, records, floor=None) -> str:
    """Which forward runs ``model``'s calls (native or transformers'; compiled, CUDA graphs or eager) and, once the
    machine's weight-read floor is known for the network (``floor``, a :class:`packed_ss.cost.Roofline`, else the
    one measured for the network by the race, Explain's call paths or the CLI's ``--json``:
    :func:`packed_ss.cost.roofline`), the median over ``records``' calls of each one's model time over its floor, the
    larger of its arithmetic and one read of the weights (:meth:`packed_ss.cost.Roofline.over`)."""
    path = getattr(model, "path", None)
    if path is None:
        return ""
    kind = ("CUDA graphs" if getattr(model, "graphs", False)
            else "compiled calls" if getattr(model, "compiled", False) else "eager calls")
    name = "the native forward" if path == "native" else "transformers' forward"
    text = f"Calls: {name}, {kind}"
    floor = floor or getattr(getattr(model, "model", None), "roofline_fit", None)
    calls = [call for record in records for call in record.calls]
    if floor is not None and calls:
        ratios = sorted(floor.over(call.model_ms, call.layout.rows) for call in calls)
        text += (f"; its calls take {ratios[len(ratios) // 2]:.1f}x the floor (the larger of their arithmetic and one "
                 f"read of the weights, {floor.read_ms:.2f} ms at {floor.read_gbs:.0f} GB/s)")
    return text + "."
