"""The web app's logic (``app.py`` at the repository root lays out the page and wires it): the Race tab
(``race_tab``, ``lanes``), the Sweep tab, the This-machine tab, the About text, start-up loading, per-session state,
plots and ZeroGPU."""
