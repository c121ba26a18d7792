"""What an audit found: :class:`AuditResult`, shared by the synchronous replay
(:mod:`.audit`) and the replay by a schedule (:mod:`.schedaudit`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from game.merkle import merkle_root


@dataclass(frozen=True)
class AuditResult:
    """Outcome of :func:`audit`: ``leaves`` are the auditor's own (for a challenge)."""

    match: bool
    trainer_state_root: bytes
    auditor_state_root: bytes
    first_divergent_step: int | None
    steps: int
    corrections: int
    profile: str
    leaves: tuple[bytes, ...] = field(repr=False, default=())
    rejected_log_steps: tuple[int, ...] = ()  # steps whose chunk did not fit the auditor's ops
    log_errors: tuple[str, ...] = ()  # why, one message per rejected step (tampering names step, op, value)
    resumed_from: int | None = None  # the step saved progress let it go on from, None for a whole replay
    #: an asynchronous task's schedule problems: the updates whose entry breaks the rules, or that
    #: apply a micro-batch an earlier update applied (each pinnable at that update)
    schedule_errors: tuple[str, ...] = ()

    @classmethod
    def of_leaves(
        cls,
        trainer_root: bytes,
        leaves: list[bytes],
        *,
        first_divergent_step: int | None,
        steps: int,
        corrections: int,
        profile: str,
        rejected_log_steps: list[int],
        log_errors: list[str],
        resumed_from: int | None,
        schedule_errors: tuple[str, ...] = (),
    ) -> AuditResult:
        """The result of a replay that computed ``leaves``: their root against the trainer's. A
        broken schedule is never a match: the auditor's leaves from it on mark no state, and a
        trainer can commit the same marks."""
        root = merkle_root(leaves)
        return cls(
            match=root == trainer_root and not schedule_errors,
            trainer_state_root=trainer_root,
            auditor_state_root=root,
            first_divergent_step=first_divergent_step,
            steps=steps,
            corrections=corrections,
            profile=profile,
            leaves=tuple(leaves),
            rejected_log_steps=tuple(rejected_log_steps),
            log_errors=tuple(log_errors),
            resumed_from=resumed_from,
            schedule_errors=schedule_errors,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "match": self.match,
            "resumed_from": self.resumed_from,
            "rejected_log_steps": list(self.rejected_log_steps),
            "log_errors": list(self.log_errors),
            "trainer_state_root": self.trainer_state_root.hex(),
            "auditor_state_root": self.auditor_state_root.hex(),
            "first_divergent_step": self.first_divergent_step,
            "steps": self.steps,
            "corrections": self.corrections,
            "profile": self.profile,
            "schedule_errors": list(self.schedule_errors),
        }


__all__ = ["AuditResult"]
