"""UI pieces of the Gradio app (token grid, mask heatmaps, race panel, charts) and the runtime glue.

No decoding logic lives here: tokens come from ``packed_ss.engine``; these modules render records and
decide which adapter runs what.
"""
