"""Training: the loop (fit), the trainer and its step, the splits, epoch 0, the time budget's
timing, what each epoch records, and the samplers."""
