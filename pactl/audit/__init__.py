"""The audit's machinery, below the verb (pactl.verbs.audit), in reading order:

- doubt.py: how much an item's neighbours and its class's centre doubt its label (numpy);
- noise_rate.py: how many of a set's labels are wrong, estimated from the set itself;
- classes.py: the class-level view: counts, label quality per class, confusable pairs;
- checks.py: the image checks (dark, bright, blurry, low-information, odd size, grayscale);
- thumbnails.py: the thumbnail descriptor that proposes copies, of whole images and crop boxes;
- alignment.py: a proposed pair aligned pixel by pixel, its likeness;
- copies.py: copies proposed by thumbnails and accepted by alignment, at a calibrated likeness;
- decisions.py: a person's decisions on the findings, applied to a manifest;
- processes.py: the work shared among fresh processes (--workers).
"""
