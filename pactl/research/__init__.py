"""The paper's experiments as library calls: published figures, run comparison, seeds, sweeps
and pictures of the embedding space. Above train and pipeline; the CLI's research verbs call it."""
