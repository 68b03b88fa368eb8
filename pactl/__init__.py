"""pactl: Proxy-Anchor metric learning and FAISS retrieval from the command line."""

__version__ = "0.1.0"
