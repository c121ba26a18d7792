"""The rules of the verification game, apart from any transport: a solver, a clock, the payouts.

Why a package of its own: every role (trainer, auditor, judge, client, anyone) decides its next
move from chain state through :mod:`game.protocol.solver`, every deadline and window rule is one
function of :mod:`game.clock` (the only timestamp arithmetic in the repository), and
:mod:`game.protocol.payouts` states the contract's money rules, :mod:`game.protocol.terms` what a
trainer asks of a task before it accepts one. No torch, no web3.
"""
