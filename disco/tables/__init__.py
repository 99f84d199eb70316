"""The table phase: every study's replay tables, built once and found again (between ``disco.replay``, which computes
one table, and ``disco.bench``, whose studies replay them).

* ``disco.tables.fitting``: the length rule (``Fitting``, ``PromptSkipped``);
* ``disco.tables.encoding``: a suite prompt's token ids (``PromptEncoder``; it never builds a table);
* ``disco.tables.identity``: what names a table (``PairSpec``, ``prompt_about``, ``table_matches``);
* ``disco.tables.lookup``: cached tables found without the models (``find_cached``, ``holds_grid``);
* ``disco.tables.build``: one prompt's table built, filled, saved and let go (``opened``, ``prepare``);
* ``disco.tables.rows``: one row per prompt of what the phase did (``prompts.csv``);
* ``disco.tables.phase``: the phase itself (``TablePhase``) and its sequential executor (``Here``);
* ``disco.tables.cluster`` and ``disco.tables.workers``: its Ray executor (``OnRay``).
"""
