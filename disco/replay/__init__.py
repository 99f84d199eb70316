"""Exact greedy replay: a table of the target's greedy output and the assistant's chains along it
(``disco.replay.tables``) replays any policy exactly, without the models (``disco.replay.run``)."""
