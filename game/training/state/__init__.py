"""The training state: its tensors by name, their canonical bytes (the checkpoint format), and the
leaf that hashes them, on the host or on the state's GPU."""
