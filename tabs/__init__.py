"""The app's tabs, one file each (Step through, Race, Explain, Benchmark), and the settings they share.

Each ``build_*_tab`` creates its widgets inside the caller's ``gr.Blocks`` and wires their events to the
serving layer (:mod:`serve`); what it draws comes from the pure UI pieces in ``components/``.
"""
