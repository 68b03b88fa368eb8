"""Training, in reading order: loop.py (fit), trainer.py (the trainer and its step), splits.py,
samplers.py, start.py and start_cache.py (epoch 0 and its cache), evaluation.py (a network's
metrics on a split), timing.py (the time budget), epoch_records.py (what each epoch records),
noise.py and robust.py (label noise), provenance.py (where data and weights came from) and
distributed.py (DDP under torchrun)."""
