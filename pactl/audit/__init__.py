"""The audit's machinery, below the verb (pactl.verbs.audit), in reading order:

- doubt.py: how much an item's neighbours and its class's centre doubt its label (numpy);
- thumbnails.py: the thumbnail descriptor that proposes copies, of whole images and crop boxes;
- alignment.py: a proposed pair aligned pixel by pixel, its likeness;
- copies.py: copies proposed by thumbnails and accepted by alignment, at a calibrated likeness;
- processes.py: the work shared among fresh processes (--workers).
"""
