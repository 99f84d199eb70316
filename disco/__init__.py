"""DISCO Lab: speculative decoding with static and dynamic (confidence-thresholded) lookahead."""

__version__ = "0.1.0"
