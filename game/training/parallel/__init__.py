"""Training on many workers (issue 45): synchronous data parallel on torch.distributed, launched by
torchrun, committing the roots and chunks of one process (:mod:`.dataparallel`, :mod:`.launch`)."""
