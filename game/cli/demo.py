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
from game.cli.options import check_profile
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
    chain: Annotated[
        str, typer.Option("--chain", help="embedded (in-process), anvil (local node) or a JSON-RPC URL.")
    ] = "embedded",
    preset: Annotated[
        str | None, typer.Option("--preset", help="Task preset (default gpt-shakespeare).")
    ] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Training steps S of the task.")] = None,
    poison_step: Annotated[
        int | None,
        typer.Option("--poison-step", help="The step where the trainer deviates (default: the middle)."),
    ] = None,
    trainer_profile: Annotated[
        str | None, typer.Option("--trainer-profile", help="Trainer's hardware profile (default cpu-1t).")
    ] = None,
    auditor_profile: Annotated[
        str | None, typer.Option("--auditor-profile", help="Auditor's hardware profile (default noisy).")
    ] = None,
    judge_profile: Annotated[
        str | None, typer.Option("--judge-profile", help="Judge's hardware profile (default splitk-16).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of a lying auditor's random answers.")] = 0,
    key: Annotated[
        str | None, typer.Option("--key", help="Funding private key for a URL chain (or VGAME_PRIVATE_KEY).")
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
    for name in profiles.values():
        check_profile(name)  # unknown, or not runnable here (cuda without a GPU): now, not after training
    kwargs: dict[str, Any] = {
        "chain_spec": chain,
        "preset": preset or demo.DEFAULT_PRESET,
        "steps": steps if steps is not None else demo.DEFAULT_STEPS,
        "poison_step": poison_step,
        "trainer_profile": profiles["trainer"],
        "auditor_profile": profiles["auditor"],
        "judge_profile": profiles["judge"],
        "auditor_seed": seed,
        "key": key,
        "workdir": workdir,
    }
    demo.prepare_scenario(  # a bad --steps or --poison-step is one line, before the live table is drawn
        scenario, preset=kwargs["preset"], steps=kwargs["steps"], poison_step=poison_step,
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
