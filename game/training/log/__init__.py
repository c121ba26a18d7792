"""The rounding log: one chunk per training step, in the packed format (a trit per rounded value)
or the sparse one (only the in-band values rounded odd), and the log root over a run's chunks."""
