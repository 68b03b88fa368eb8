"""Binary codes without FAISS, in reading order:

- rotation.py: sign codes after a rotation chosen by measurement (none, ITQ, LSH), packed;
- hamming.py: exact Hamming neighbours (ties broken by id) and the retrieval metrics of codes;
- learned.py: the losses of codes learned with the network (`pactl train --bits N`).

The binary bundles that search such codes through FAISS are pactl.index.binary's.
"""
