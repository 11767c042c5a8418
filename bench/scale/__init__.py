"""The phases of bench/scale_curve.py (the command line entry point): :mod:`.state`,
:mod:`.prepare`, :mod:`.postgres`, :mod:`.generate`, :mod:`.measure` and :mod:`.report`."""
