"""``vgame demo``: one scenario, end to end on a chain, shown live or as one JSON document.

The scenario list in ``--help`` comes from :mod:`game.scenarios` (no torch), so the help stays fast;
the run itself (torch, web3, the agents) is imported inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from game.cli.app import app, console, emit_json
from game.cli.keys import warn_key_in_argv
from game.cli.options import CHAIN_MEANING, FRESH_CHAINS, check_profile, checked_chain
from game.errors import ConfigError
from game.scenarios import SCENARIOS

if TYPE_CHECKING:
    from game.agents import AgentAction
    from game.demoreport import DemoResult

_SCENARIO_HELP = "Scenario to play: " + "; ".join(f"{s.name}: {s.summary}" for s in SCENARIOS.values())
_WEI_PER_ETH = 10**18

_DEMO_HELP = (
    "Play one scenario end to end: a client posts a task, a trainer trains and commits, an auditor "
    "on other hardware replays and challenges, the two bisect on-chain and a judge re-runs the "
    "disputed step. Scenarios: " + ", ".join(SCENARIOS)
)


@app.command("demo", help=_DEMO_HELP)
def demo_cmd(
    scenario: Annotated[str, typer.Option("--scenario", "-s", help=_SCENARIO_HELP)] = "poison",
    chain: Annotated[str, typer.Option("--chain", help=f"The chain: {CHAIN_MEANING}.")] = "embedded",
    preset: Annotated[
        str | None, typer.Option("--preset", help="Task preset (default gpt-shakespeare).")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="A task config instead of a preset's example (your own task too)."),
    ] = None,
    steps: Annotated[
        int | None, typer.Option("--steps", help="Training steps of the task (default 50).")
    ] = None,
    poison_step: Annotated[
        int | None,
        typer.Option(
            "--poison-step",
            help="The step S where the trainer deviates, in the scenarios that have one (default: the "
            "middle step).",
        ),
    ] = None,
    trainer_profile: Annotated[
        str | None, typer.Option("--trainer-profile", help="Trainer's hardware profile (default cpu-1t).")
    ] = None,
    auditor_profile: Annotated[
        str | None, typer.Option("--auditor-profile", help="Auditor's hardware profile (default noisy).")
    ] = None,
    judge_profile: Annotated[
        str | None,
        typer.Option(
            "--judge-profile",
            help="Judge's hardware profile (default splitk-16), in the scenarios whose game a judge rules.",
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed", show_default="0", help="Seed of a lying auditor's answers (scenario false-alarm)."
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            help="Funding key of a URL chain: 0x-hex private key or keystore file (or VGAME_PRIVATE_KEY); "
            "embedded and anvil fund their own accounts.",
        ),
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir", help="Keep the agents' files in this empty or new directory (default: a temp dir)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document for scripts.")] = False,
) -> None:
    from game import demo

    profiles = {
        "trainer": trainer_profile or demo.DEFAULT_TRAINER_PROFILE,
        "auditor": auditor_profile or demo.DEFAULT_AUDITOR_PROFILE,
        "judge": judge_profile or demo.DEFAULT_JUDGE_PROFILE,
    }
    chain = checked_chain(chain)
    if key is not None and chain in FRESH_CHAINS:
        raise ConfigError(
            f"--key does nothing with --chain {chain}, which funds its own accounts: it is the funding "
            "key of a chain given by its JSON-RPC URL"
        )
    if seed is not None and SCENARIOS.get(scenario).auditor_strategy != "lying":
        lying = ", ".join(s.name for s in SCENARIOS.values() if s.auditor_strategy == "lying")
        raise ConfigError(
            f"--seed does nothing in scenario {scenario!r}, whose auditor draws nothing at random: it "
            f"seeds the lying auditor of {lying}"
        )
    if judge_profile is not None and SCENARIOS.get(scenario).ends_by != "ruling":
        ruled = ", ".join(s.name for s in SCENARIOS.values() if s.ends_by == "ruling")
        raise ConfigError(
            f"--judge-profile does nothing in scenario {scenario!r}, where no judge re-runs a step: "
            f"it is for {ruled}"
        )
    for name in profiles.values():
        check_profile(name)  # unknown, or not runnable here (cuda without a GPU): now, not after training
    if config is not None and preset is not None:
        raise ConfigError("--preset and --config both name the task: give one of them")
    task_cfg = None
    if config is not None:
        from game.training.task.config import load_config

        task_cfg = load_config(config)
        task_cfg = task_cfg.replace(steps=steps) if steps is not None else task_cfg
    kwargs: dict[str, Any] = {
        "chain_spec": chain,
        "preset": preset or demo.DEFAULT_PRESET,
        "config": task_cfg,
        "steps": steps if steps is not None else demo.DEFAULT_STEPS,
        "poison_step": poison_step,
        "trainer_profile": profiles["trainer"],
        "auditor_profile": profiles["auditor"],
        "judge_profile": profiles["judge"],
        "auditor_seed": 0 if seed is None else seed,
        "key": key,
        "workdir": workdir,
    }
    demo.prepare_scenario(  # a bad --steps or --poison-step is one line, before the live table is drawn
        scenario, preset=kwargs["preset"], steps=kwargs["steps"], config=task_cfg, poison_step=poison_step,
        trainer_profile=profiles["trainer"], auditor_profile=profiles["auditor"], workdir=workdir,
    )  # fmt: skip
    from game.chain.backends import connect

    # the chain before the live table: a URL with no key, or no node there, is one line
    warn_key_in_argv(kwargs["key"], kwargs["chain_spec"])
    with connect(kwargs.pop("chain_spec"), key=kwargs.pop("key")) as open_chain:
        if as_json:
            emit_json(demo.run_scenario(scenario, chain=open_chain, **kwargs).to_dict())
            return
        view = _LiveView(scenario)
        try:
            with Live(view.render(), console=console, refresh_per_second=8, transient=False) as live:
                view.live = live
                result = demo.run_scenario(
                    scenario, chain=open_chain, on_action=view.action, progress=view.progress, **kwargs
                )
        except KeyboardInterrupt:  # the table's last line ends here, not in the "interrupted" line
            console.print()
            raise
    console.print()
    console.print(_verdict(result))


class _LiveView:
    """Progress bars for training and replay above a table of every move, refreshed as they come."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.bars = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        self.tasks: dict[str, TaskID] = {}
        self.rows: list[tuple[str, ...]] = []
        self.live: Live | None = None

    def progress(self, label: str, done: int, total: int) -> None:
        task = self.tasks.get(label)
        if task is None:
            task = self.tasks[label] = self.bars.add_task(label, total=total)
        self.bars.update(task, completed=done, total=total)
        self._refresh()

    def action(self, a: AgentAction) -> None:
        if a.what == "idle":
            return
        self.rows.append(
            (
                a.actor,
                a.what,
                "" if a.game_id is None else str(a.game_id),
                "" if a.leaf_index is None else str(a.leaf_index),
                "" if a.gas_used is None else f"{a.gas_used:,}",
                _short(a.tx_hash),
                a.detail,
            )
        )
        self._refresh()

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self.render())

    def render(self) -> Group:
        table = Table(title=f"scenario {self.scenario}: moves", expand=True)
        table.add_column("who", style="bold", no_wrap=True, min_width=7)
        table.add_column("what", style="cyan", no_wrap=True, min_width=9)
        table.add_column("game", justify="right", no_wrap=True, min_width=4)
        table.add_column("leaf", justify="right", no_wrap=True, min_width=4)
        table.add_column("gas", style="green", justify="right", no_wrap=True, min_width=7)
        table.add_column("tx", style="dim", no_wrap=True, min_width=13)
        table.add_column("detail", overflow="ellipsis", no_wrap=True, ratio=1)
        for row in self.rows:
            table.add_row(*row)
        return Group(self.bars, table)


def _short(tx: str | None) -> str:
    if not tx:
        return ""
    return tx[:8] + "…" + tx[-4:]


def _eth(wei: int) -> str:
    return f"{wei / _WEI_PER_ETH:+.6f} ETH" if wei else "0"


def _verdict(result: DemoResult) -> Panel:
    lines = []
    ok = result.winner == result.expected_winner
    colour = "green" if ok and result.balances_ok else "red"
    lines.append(f"[bold]winner[/]          {result.winner}  (the rules promise: {result.expected_winner})")
    if result.disputed_step is not None:
        lines.append(f"[bold]disputed step[/]   {result.disputed_step} (re-run by the judge)")
    if result.deviation_step is not None:
        lines.append(f"[bold]deviation[/]       at step {result.deviation_step}")
    if result.end_reason:
        lines.append(f"[bold]game ended by[/]   {result.end_reason}")
    if result.demands:
        lines.append(
            f"[bold]data demands[/]    {result.demands} pieces of the log demanded on-chain (the auditor "
            "could not open the transcript)"
        )
    lines.append(f"[bold]trainer paid[/]    {'yes' if result.trainer_paid else 'no'}")
    lines.append(
        f"[bold]profiles[/]        trainer {result.trainer_profile}, auditor {result.auditor_profile}, "
        f"judge {result.judge_profile}"
    )
    lines.append(
        f"[bold]chain[/]           {result.chain}: {result.transactions} transactions, "
        f"{result.moves} game moves, {result.gas_total:,} gas"
    )
    lines.append("")
    table = Table(title="balances (wei changes, fees included)", expand=False)
    for col in ("party", "change", "fees", "rules say", "ok"):
        table.add_column(col, justify="left" if col == "party" else "right")
    for party, b in result.balances.items():
        table.add_row(
            party,
            _eth(b.change),
            _eth(-b.gas_cost),
            _eth(b.expected_change),
            "[green]yes[/]" if b.ok else "[red]NO[/]",
        )
    footer = (
        f"contract keeps {result.contract_balance} wei"
        + (" (burnt)" if result.burnt else "")
        + "; balances "
        + ("[green]add up[/]" if result.balances_ok else "[red]do NOT add up[/]")
        + f"; {result.elapsed_s:.1f} s"
    )
    return Panel(
        Group("\n".join(lines), table, footer),
        title=f"verdict: {result.scenario}",
        border_style=colour,
    )
