"""Alternative strategies: dishonest trainers and dishonest auditors, for tests and the demo.

Why a room of its own: the product plays honestly and only offers hooks (a trainer's
``Deviation``, an auditor's ``AuditorStrategy``); the players that cheat, lie or fall silent live
here, so that no product code (nodes, agents, judge, training, chain) can reach them.
:mod:`game.strategies.trainers` holds the trainers' deviations, :mod:`game.strategies.auditors`
the auditors' strategies; each module names its own in a :class:`~game.registry.Registry`.
"""
