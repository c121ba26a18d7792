"""The step engine and the loops around it: training, auditing, and re-running one committed step
(the judge's primitive)."""
