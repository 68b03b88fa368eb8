"""Binary codes of float vectors and the bundles that hold them: the rotation before the signs
(codes.py), the index a binary bundle searches, its Hamming candidates rescored by exact cosine
(search.py), its build and tuning (build.py), and the metrics of codes on a labelled set
(metrics.py)."""
