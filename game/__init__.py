"""vgame: verifiable ML training settled by an on-chain verification game.

``game`` holds what every role shares: the Merkle tree, the chain layer, the deterministic
training core and the judge. ``trainer_node`` and ``auditor_node`` are the two agents.
"""

__version__ = "0.1.0"
