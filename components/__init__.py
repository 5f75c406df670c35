"""UI pieces of the Gradio app: token and order grids, mask heatmaps, narration, text and stats, the race
panel, charts and styles. Each is a pure function of records; none holds decoding logic or serving state
(tokens come from ``packed_ss.engine``, requests are run by ``serve``).
"""
