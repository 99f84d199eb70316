"""What a pass costs: the pure cost model and cost profiles (``disco.costs.model``: measured, ``flat:C``, a CSV)
and this pair's measured per-pass costs (``disco.costs.measure``)."""
