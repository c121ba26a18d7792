"""The rounding log: one chunk per training step, in the packed format (a trit per rounded value)
or the sparse one (only the in-band values rounded odd), and the log root over a run's chunks."""

#: Rounding-log formats: ``sparse`` lists only in-band values, ``packed`` a trit for every value.
LOG_FORMATS = ("sparse", "packed")

__all__ = ["LOG_FORMATS"]
