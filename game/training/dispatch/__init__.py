"""The interception of a training step's ATen ops: the op table, the dispatch mode and its roles, and
the C++ front's session (the mode's stand-in on CPU), the hardware profiles it emulates, and the
draws it serves."""
