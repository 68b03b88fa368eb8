"""The library side of each verb, one module each: what the CLI and the Python API call."""
