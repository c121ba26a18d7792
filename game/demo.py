"""Run one scenario end to end on a chain: client, trainer, auditor and judge, all by transaction.

Why an orchestrator and not three processes: the demo and the scenario tests must be one command
on an in-process chain. The agents here are the very objects the long-lived nodes loop over
(``TrainerAgent``, ``AuditorAgent``, ``Judge``): each ``step()`` does whatever is due *now* and
never sleeps. The loop steps every active agent; when a whole round does nothing, the only thing
left is time, so it moves the chain's clock just past the next relevant deadline (the challenge
window's end, a game's clock or the judge's deadline), or, on a chain whose clock cannot move,
sleeps until then. It stops once the task is settled and every credit is withdrawn, then checks
the money: the contract holds nothing and every party's balance moved exactly as the rules say.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from game import clock
from game.demoreport import DemoResult, demo_result
from game.errors import ConfigError, VGameError
from game.scenarios import Scenario, get_scenario

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from game.agents import AgentAction
    from game.chain.base import Chain
    from game.chain.client import VerificationGameClient
    from game.tasks import TaskTerms
    from game.training.engine.train import Deviation
    from game.training.task.config import TaskConfig

log = logging.getLogger(__name__)

#: The demo's default task: the CI-sized Shakespeare GPT, short enough for 2 cores in < 3 minutes.
DEFAULT_PRESET = "gpt-shakespeare"
DEFAULT_STEPS = 50
DEFAULT_TRAINER_PROFILE = "cpu-1t"
DEFAULT_AUDITOR_PROFILE = "noisy"
DEFAULT_JUDGE_PROFILE = "splitk-16"

PARTIES = ("client", "trainer", "auditor", "judge")
#: Idle rounds with nothing ahead before the demo gives up, and the nap between them on a real chain.
STUCK_ROUNDS = 5
REALTIME_STUCK_ROUNDS = 60  # a testnet's next block may be many seconds away
REALTIME_NAP_S = 2.0
#: Ether given to each fresh account on a chain with a single funded key (a testnet).
FRESH_ACCOUNT_FUNDS = 5 * 10**15

ActionSink = Callable[["AgentAction"], None]
ProgressSink = Callable[[str, int, int], None]


class DemoError(VGameError, RuntimeError):
    """The scenario could not be played to its end (nothing left to do, yet the task is not settled)."""


def demo_config(preset: str = DEFAULT_PRESET, steps: int | None = DEFAULT_STEPS) -> TaskConfig:
    """The preset's example task (``game/training/task/presets/<preset>.toml``), with ``steps`` if given."""
    from game.training.task.config import example_config

    cfg = example_config(preset)
    return cfg.replace(steps=steps) if steps is not None else cfg


def prepare_scenario(
    name: str,
    *,
    preset: str = DEFAULT_PRESET,
    steps: int | None = DEFAULT_STEPS,
    config: TaskConfig | None = None,
    poison_step: int | None = None,
    trainer_profile: str = DEFAULT_TRAINER_PROFILE,
    auditor_profile: str = DEFAULT_AUDITOR_PROFILE,
    workdir: Path | None = None,
) -> tuple[Scenario, TaskConfig, Deviation | None]:
    """The scenario, its task and its trainer's deviation, or a :class:`ConfigError` naming what
    is wrong: cheap, so a caller checks its arguments before it draws or connects anything."""
    if workdir is not None and Path(workdir).is_dir() and any(Path(workdir).iterdir()):
        raise ConfigError(
            f"--workdir {workdir} is not empty: each demo deploys a fresh contract and posts task 1, "
            "so an earlier run's files would mislead its agents; give an empty or new directory"
        )
    scenario = get_scenario(name)
    if len({trainer_profile, auditor_profile}) < 2:
        raise ConfigError(
            f"trainer and auditor must run on different profiles (both {trainer_profile!r}): "
            "the demo shows replication across hardware"
        )
    cfg = config if config is not None else demo_config(preset, steps)
    if poison_step is not None and not scenario.takes_step:
        raise ConfigError(f"scenario {name!r} has no deviating step; drop --poison-step")
    return scenario, cfg, scenario.make_deviation(cfg, poison_step)


def run_scenario(
    name: str,
    *,
    chain_spec: str = "embedded",
    preset: str = DEFAULT_PRESET,
    steps: int | None = DEFAULT_STEPS,
    config: TaskConfig | None = None,
    poison_step: int | None = None,
    trainer_profile: str = DEFAULT_TRAINER_PROFILE,
    auditor_profile: str = DEFAULT_AUDITOR_PROFILE,
    judge_profile: str = DEFAULT_JUDGE_PROFILE,
    auditor_seed: int = 0,
    terms: TaskTerms | None = None,
    workdir: Path | None = None,
    chain: Chain | None = None,
    key: str | None = None,
    on_action: ActionSink | None = None,
    progress: ProgressSink | None = None,
    max_rounds: int = 500,
) -> DemoResult:
    """Play scenario ``name`` to the end and report who won and whether the money adds up.

    ``config`` (a whole task) overrides ``preset``/``steps``; ``poison_step`` is the step S where
    the trainer deviates (default: the middle step). ``chain`` reuses an open chain (a fresh
    contract is deployed on it either way); otherwise ``chain_spec`` is connected and closed here.
    """
    scenario, cfg, deviation = prepare_scenario(
        name, preset=preset, steps=steps, config=config, poison_step=poison_step,
        trainer_profile=trainer_profile, auditor_profile=auditor_profile, workdir=workdir,
    )  # fmt: skip
    step_s = getattr(deviation, "step", None)
    with ExitStack() as stack:
        if chain is None:
            from game.chain.backends import connect

            chain = stack.enter_context(connect(chain_spec, key=key))
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vgame-demo-")))
        run = _Run(
            scenario=scenario,
            chain=chain,
            cfg=cfg,
            deviation=deviation,
            deviation_step=step_s,
            profiles=(trainer_profile, auditor_profile, judge_profile),
            auditor_seed=auditor_seed,
            terms=terms,
            workdir=Path(workdir),
            on_action=on_action,
            progress=progress,
        )
        return run.play(max_rounds)
    raise AssertionError("unreachable")  # pragma: no cover - the with block returns


class _Run:
    """One scenario on one chain: the parties, their agents, the loop and the final accounting."""

    def __init__(
        self,
        *,
        scenario: Scenario,
        chain: Chain,
        cfg: TaskConfig,
        deviation: Any,
        deviation_step: int | None,
        profiles: tuple[str, str, str],
        auditor_seed: int,
        terms: TaskTerms | None,
        workdir: Path,
        on_action: ActionSink | None,
        progress: ProgressSink | None,
    ) -> None:
        from game.tasks import REALTIME_TERMS, TaskTerms

        self.scenario = scenario
        self.chain = chain
        self.cfg = cfg
        self.deviation = deviation
        self.deviation_step = deviation_step
        self.profiles = profiles
        self.auditor_seed = auditor_seed
        self.terms = terms or (TaskTerms() if chain.supports_time_travel else REALTIME_TERMS)
        self.workdir = workdir
        self.on_action = on_action
        self.progress = progress
        self.actions: list[AgentAction] = []
        self.started = time.monotonic()

    # ------------------------------------------------------------------ setup
    def _accounts(self) -> dict[str, LocalAccount]:
        """Four distinct accounts; on a chain with one funded key, three fresh funded ones."""
        chain = self.chain
        if len(chain.accounts) >= len(PARTIES):
            return {p: chain.account(i) for i, p in enumerate(PARTIES)}
        client = chain.account(0)
        out = {"client": client}
        for p in PARTIES[1:]:
            out[p] = chain.new_account(FRESH_ACCOUNT_FUNDS)
            log.info("funded a fresh %s account %s", p, out[p].address)
        return out

    def record(self, action: AgentAction) -> None:
        self.actions.append(action)
        if action.what != "idle":
            log.info(
                "%s %s task %s game %s leaf %s gas %s %s",
                action.actor,
                action.what,
                action.task_id,
                action.game_id,
                action.leaf_index,
                action.gas_used,
                action.detail,
            )
        if self.on_action is not None:
            self.on_action(action)

    def play(self, max_rounds: int) -> DemoResult:
        from auditor_node.agent import AuditorAgent
        from game.agents import AgentAction
        from game.chain.client import VerificationGameClient
        from game.chain.deploy import deploy
        from game.judge import Judge
        from game.store.blobs import BlobStore
        from game.store.keys import key_hash, new_key
        from game.tasks import post_task

        chain = self.chain
        accounts = self._accounts()
        address = deploy(chain, accounts["client"])
        clients = {p: VerificationGameClient(chain, address, acct) for p, acct in accounts.items()}
        start = {p: chain.balance(a.address) for p, a in accounts.items()}

        data_key = new_key()
        store = BlobStore(self.workdir / "store")
        evidence = self.workdir / "evidence"
        trainer_profile, auditor_profile, judge_profile = self.profiles
        receipt = post_task(
            clients["client"],
            self.cfg.spec_hash(),
            key_hash=key_hash(data_key),
            num_leaves=self.cfg.num_leaves,
            trainer=accounts["trainer"].address,
            judge=accounts["judge"].address,
            terms=self.terms,
        )
        task_id = receipt.result
        if task_id is None:
            raise DemoError("createTask emitted no TaskCreated event")
        self.record(
            AgentAction(
                actor="client",
                what="post",
                task_id=task_id,
                gas_used=receipt.gas_used,
                tx_hash=receipt.tx_hash,
                detail=f"payment {self.terms.payment / 10**18:g} ETH, spec {self.cfg.spec_hash().hex()[:12]}…",
            )
        )
        agents: dict[str, Any] = {
            "trainer": self.scenario.trainer_class()(
                clients["trainer"],
                task_id,
                self.cfg,
                profile=trainer_profile,
                workdir=self.workdir / "trainer",
                store=store,
                data_key=data_key,
                deviation=self.deviation,
                on_action=self.record,
                progress=self.progress,
            ),
            "auditor": AuditorAgent(
                clients["auditor"],
                task_id,
                profile=auditor_profile,
                workdir=self.workdir / "auditor",
                store=store,
                data_key=data_key,
                strategy=self.scenario.make_auditor(self.auditor_seed),
                config=self.cfg,  # the client's: to replay a withheld log read off the chain
                evidence_dir=evidence,
                on_action=self.record,
                progress=self.progress,
            ),
            "judge": Judge(
                clients["judge"],
                profile=judge_profile,
                workdir=self.workdir / "judge",
                store=store,
                data_key=data_key,
                evidence_dir=evidence,
                on_action=self.record,
            ),
        }
        client = clients["client"]
        stuck = 0
        for _ in range(max_rounds):
            acted = False
            for party, agent in agents.items():
                if self._silenced(party, client, task_id):
                    continue
                done = agent.step()
                acted = acted or any(a.what != "idle" for a in done)
            if self._settled(clients, task_id):
                break
            if acted:
                stuck = 0
                continue
            if self._client_chores(client, task_id):
                stuck = 0
                continue
            if self._wait_for_next_deadline(client, task_id):
                stuck = 0
                continue
            # Nothing ahead, yet not settled: a deadline passed in the latest block and a move
            # needs a later one. Give the chain a block (or, for real, a moment) a few times.
            stuck += 1
            if stuck > (STUCK_ROUNDS if self.chain.supports_time_travel else REALTIME_STUCK_ROUNDS):
                raise DemoError(self._stuck_message(client, task_id))
            if self.chain.supports_time_travel:
                self.chain.time_travel(1)
            else:
                time.sleep(REALTIME_NAP_S)
        else:
            raise DemoError(f"scenario {self.scenario.name!r} did not settle in {max_rounds} rounds")
        return demo_result(self, clients, accounts, address, task_id, start)

    # ------------------------------------------------------------------ loop helpers
    def _silenced(self, party: str, client: VerificationGameClient, task_id: int) -> bool:
        """The scenario's silent party stops moving once a game against the task is open."""
        if self.scenario.silent_after_challenge != party:
            return False
        from game.tasks import task_game_ids

        return bool(task_game_ids(client, task_id))

    def _settled(self, clients: dict[str, VerificationGameClient], task_id: int) -> bool:
        from game.chain.types import TaskStatus
        from game.protocol.solver import decide_claims
        from game.tasks import task_games

        client = clients["client"]
        t = client.task(task_id)
        if t.status not in (TaskStatus.FINALIZED, TaskStatus.CANCELLED):
            return False
        if decide_claims(t, task_games(client, task_id)):
            return False  # a winning auditor's share of the trainer's bond is still to be claimed
        return all(c.credit() == 0 for c in clients.values())

    def _client_chores(self, client: VerificationGameClient, task_id: int) -> bool:
        """What the client does when the agents have nothing to do: settle, claim a winner's reward
        its auditor left unclaimed (anyone may), then reclaim."""
        from game.agents import AgentAction
        from game.tasks import claim_rewards, finalize_if_due, reclaim

        rec = finalize_if_due(client, task_id)
        what = "finalize"
        if rec is None:
            t = client.task(task_id)
            if t.status.name not in ("FINALIZED", "CANCELLED"):
                return False
            claims = claim_rewards(client, task_id)
            rec, what = (claims[0], "claim") if claims else (reclaim(client), "withdraw")
        if rec is None:
            return False
        self.record(
            AgentAction(
                actor="client", what=what, task_id=task_id, gas_used=rec.gas_used, tx_hash=rec.tx_hash
            )
        )
        return True

    def _next_deadline(self, client: VerificationGameClient, task_id: int) -> int | None:
        """The earliest time after which something becomes possible: window end, clocks, judge."""
        from game.chain.types import Phase, TaskStatus
        from game.tasks import task_games

        t = client.task(task_id)
        now = self.chain.now()
        cands: list[int] = []
        if t.status == TaskStatus.COMMITTED:
            cands.append(t.window_ends)
        for gid, g in task_games(client, task_id):
            if g.phase != Phase.ENDED:
                cands.append(clock.timeout_from(client.deadline(gid)))
        return clock.next_due(now, cands)

    def _wait_for_next_deadline(self, client: VerificationGameClient, task_id: int) -> bool:
        target = self._next_deadline(client, task_id)
        if target is None:
            return False
        now = self.chain.now()
        ahead = clock.seconds_until(now, target)
        if self.chain.supports_time_travel:
            self.chain.time_travel(clock.travel_seconds(now, target))
            log.info("time travel %d s to %d (next deadline)", ahead, target)
            return True
        # a real chain: wait for real, in short naps, so the agents keep watching meanwhile
        time.sleep(min(5.0, max(REALTIME_NAP_S, float(ahead))))
        return True

    def _stuck_message(self, client: VerificationGameClient, task_id: int) -> str:
        from game.tasks import describe_task

        state = describe_task(client, task_id)
        games = ", ".join(f"game {g['game_id']} {g['phase']}" for g in state["games"]) or "no games"
        return (
            f"scenario {self.scenario.name!r} is stuck: no agent acts and no deadline is ahead "
            f"(task {task_id} {state['status']}, {games})"
        )


__all__ = [
    "DEFAULT_AUDITOR_PROFILE",
    "DEFAULT_JUDGE_PROFILE",
    "DEFAULT_PRESET",
    "DEFAULT_STEPS",
    "DEFAULT_TRAINER_PROFILE",
    "DemoError",
    "demo_config",
    "prepare_scenario",
    "run_scenario",
]
