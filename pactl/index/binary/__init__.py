"""Bundles of binary codes (the codes themselves, and their rotation, are pactl.codes'), in
reading order: build.py (the binary index, its build and tuning), search.py (Hamming candidates
rescored by exact cosine) and metrics.py (the metrics of codes on a labelled set)."""
