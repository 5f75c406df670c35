"""One colour and one marker symbol per schedule, shared by every chart (benchmark reports, the app's race and
Explain charts), so a schedule looks the same everywhere; and the colour distance that says two colours differ.

The colours are picked to stay apart for the eye: every pair is at least :data:`MIN_DISTANCE` apart in CIEDE2000
(plotly's Dark24, the palette the reports used before, has pairs 9 apart: #E15F99 and #FC0080, #DA16FF and
#FB00D1), and each has a contrast of at least 3:1 on a white plot (WCAG's rule for graphics). Colour is never the
only cue: the symbols differ too, for colour-blind readers and for points drawn on top of each other.
"""

from __future__ import annotations

import math

SCHEDULE_COLORS = {
    "ar": "#4d4d4d",  # the reference: dark grey
    "linear": "#1f6fd1",  # blue
    "quadratic": "#e66100",  # orange
    "packed": "#1a9641",  # green
    "diffusion": "#a68a00",  # mustard
    "lookup": "#e7298a",  # pink
    "packed-mixed": "#0095a8",  # teal
    "partial": "#8c510a",  # brown
    "hf-greedy": "#7b3fd6",  # violet
    "hf-lookup": "#c8102e",  # red
    "hf-greedy-compiled": "#0b2e6b",  # navy
    "ar-eager": "#8f8f8f",  # light grey (AR's eager twin)
    "llamacpp-ar": "#6c1348",  # plum
    "llamacpp-lookup": "#525f1f",  # olive
    "vllm-ar": "#401808",  # dark brown
    "vllm-ngram": "#9988cc",  # lavender
    "vllm-suffix": "#004433",  # dark green
    "vllm-linear": "#020009",  # near black (the only colour left 20 apart from the others)
}
SCHEDULE_SYMBOLS = {
    "ar": "circle", "linear": "square", "quadratic": "diamond", "packed": "circle-open", "diffusion": "x",
    "lookup": "triangle-up", "packed-mixed": "star", "partial": "triangle-down", "hf-greedy": "pentagon",
    "hf-lookup": "hexagon", "hf-greedy-compiled": "cross", "ar-eager": "square-open",
    "llamacpp-ar": "diamond-open", "llamacpp-lookup": "triangle-up-open",
    "vllm-ar": "circle-x", "vllm-ngram": "triangle-down-open", "vllm-suffix": "star-open",
    "vllm-linear": "square-x",
}
OTHER_COLOR = "#5b6770"  # a schedule without its own colour
MIN_DISTANCE = 20.0  # least CIEDE2000 distance between two schedules' colours (tested)


def schedule_color(name: str) -> str:
    """The chart colour of schedule ``name`` (:data:`OTHER_COLOR` for a name without its own)."""
    return SCHEDULE_COLORS.get(name, OTHER_COLOR)


def schedule_symbol(name: str) -> str:
    """The plotly marker symbol of schedule ``name`` ("circle" for a name without its own)."""
    return SCHEDULE_SYMBOLS.get(name, "circle")


def _linear(channel: int) -> float:
    """An sRGB channel (0-255) as linear light (IEC 61966-2-1)."""
    c = channel / 255
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def rgb(color: str) -> tuple[int, int, int]:
    """``"#rrggbb"`` as three 0-255 channels. Raises: ValueError for anything else."""
    if len(color) != 7 or color[0] != "#":
        raise ValueError(f"expected #rrggbb, got {color!r}")
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def luminance(color: str) -> float:
    """WCAG relative luminance of ``"#rrggbb"`` (0 black, 1 white)."""
    r, g, b = (_linear(c) for c in rgb(color))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(first: str, second: str) -> float:
    """WCAG contrast ratio of two ``"#rrggbb"`` colours (1 to 21)."""
    high, low = sorted((luminance(first), luminance(second)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def lab(color: str) -> tuple[float, float, float]:
    """CIELAB (D65) coordinates of ``"#rrggbb"``."""
    r, g, b = (_linear(c) for c in rgb(color))
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def distance(first: str, second: str) -> float:
    """CIEDE2000 colour difference of two ``"#rrggbb"`` colours (Sharma, Wu and Dalal 2005; about 2 is just
    noticeable, over 20 is clearly another colour)."""
    (l1, a1, b1), (l2, a2, b2) = lab(first), lab(second)
    c_mean = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(c_mean ** 7 / (c_mean ** 7 + 25 ** 7)))
    a1, a2 = (1 + g) * a1, (1 + g) * a2  # a' (the a axis stretched for neutral colours)
    c1, c2 = math.hypot(a1, b1), math.hypot(a2, b2)
    h1, h2 = (math.degrees(math.atan2(b, a)) % 360 for a, b in ((a1, b1), (a2, b2)))
    dh = 0.0 if c1 * c2 == 0 else (h2 - h1 + 180) % 360 - 180
    d_l, d_c = l2 - l1, c2 - c1
    d_h = 2 * math.sqrt(c1 * c2) * math.sin(math.radians(dh / 2))
    l_mean, c_mean = (l1 + l2) / 2, (c1 + c2) / 2
    if c1 * c2 == 0:
        h_mean = h1 + h2
    elif abs(h1 - h2) <= 180:
        h_mean = (h1 + h2) / 2
    else:
        h_mean = (h1 + h2 + 360) / 2 if h1 + h2 < 360 else (h1 + h2 - 360) / 2
    t = (1 - 0.17 * math.cos(math.radians(h_mean - 30)) + 0.24 * math.cos(math.radians(2 * h_mean))
         + 0.32 * math.cos(math.radians(3 * h_mean + 6)) - 0.20 * math.cos(math.radians(4 * h_mean - 63)))
    s_l = 1 + 0.015 * (l_mean - 50) ** 2 / math.sqrt(20 + (l_mean - 50) ** 2)
    s_c, s_h = 1 + 0.045 * c_mean, 1 + 0.015 * c_mean * t
    r_t = (-2 * math.sqrt(c_mean ** 7 / (c_mean ** 7 + 25 ** 7))
           * math.sin(math.radians(60 * math.exp(-(((h_mean - 275) / 25) ** 2)))))
    return math.sqrt((d_l / s_l) ** 2 + (d_c / s_c) ** 2 + (d_h / s_h) ** 2 + r_t * (d_c / s_c) * (d_h / s_h))
