"""The client takes its trained model: the committed final state, held to the chain, as a state_dict."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from game.chain.types import TaskStatus
from game.delivery import fetch_model
from game.errors import DeliveryError
from game.store.keys import new_key
from game.training.engine.runtime import runtime_for
from game.training.engine.states import decode_state
from game.training.transcript.reader import Transcript
from tests.agents.conftest import PoisonBatch, commit, run_game, small_config


def _committed(roles: dict[str, Any], post_task: Any, make_agents: Any, cfg: Any) -> Any:
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg)
    commit(agents, roles["client"], task_id)
    return task_id, agents


def test_theModel_isTheCommittedFinalState_loadableIntoThePresetsModel(
    roles: dict[str, Any], post_task: Any, make_agents: Any, store: Any, data_key: bytes, tmp_path: Path
) -> None:
    cfg = small_config(steps=4)
    task_id, agents = _committed(roles, post_task, make_agents, cfg)
    client = roles["client"]
    got = fetch_model(client, task_id, store, data_key, tmp_path / "model.pt")
    assert (got.steps, got.preset, got.status) == (4, cfg.preset, TaskStatus.COMMITTED)
    assert not got.settled and "challenge window is open" in got.standing(client.chain.now())

    weights = torch.load(got.path)
    assert all(t.dtype == torch.float32 for t in weights.values() if t.is_floating_point())
    model = runtime_for(cfg).build_model()
    model.load_state_dict(weights)  # every name and shape the task's model has
    t = Transcript(agents.trainer.transcript_dir)
    final = decode_state(t.load_checkpoint(4), cfg).model.state_dict()
    assert got.final_leaf == t.leaf(4) == client.task(task_id).last_leaf
    assert set(weights) == set(final)
    for name, value in model.state_dict().items():
        assert torch.equal(value, final[name]), name  # float32 loses nothing: the values lie on its grid
    assert got.values == sum(v.numel() for v in weights.values())

    chain = client.chain
    chain.time_travel(client.task(task_id).window_ends - chain.now() + 1)
    client.finalize(task_id)
    settled = fetch_model(client, task_id, store, data_key, tmp_path / "again.pt")
    assert settled.settled and "no challenge showed the training wrong" in settled.standing(chain.now())


def test_aModelAnAuditorShowedWrong_saysSo(
    roles: dict[str, Any], post_task: Any, make_agents: Any, store: Any, data_key: bytes, tmp_path: Path
) -> None:
    cfg = small_config(steps=4)
    task_id = post_task(cfg)
    agents = make_agents(task_id, cfg, deviation=PoisonBatch(cfg, 2))
    run_game(agents, roles["client"], task_id)
    got = fetch_model(roles["client"], task_id, store, data_key, tmp_path / "model.pt")
    assert got.trainer_lost and not got.settled
    assert "showed a step of this training wrong" in got.standing(roles["client"].chain.now())


def test_noCommitment_aWrongKey_orFilesTheChainDoesNotVouchFor_writeNothing(
    roles: dict[str, Any], post_task: Any, make_agents: Any, store: Any, data_key: bytes, tmp_path: Path
) -> None:
    cfg = small_config(steps=3)
    client, out = roles["client"], tmp_path / "model.pt"
    open_task = post_task(cfg)
    with pytest.raises(DeliveryError, match="no commitment yet"):
        fetch_model(client, open_task, store, data_key, out)
    task_id, _ = _committed(roles, post_task, make_agents, cfg)
    with pytest.raises(DeliveryError, match="wrong key"):
        fetch_model(client, task_id, store, new_key(), out)
    task = client.task(task_id)
    for changed, says in (
        ({"last_leaf": bytes(32)}, "does not hash to the last leaf"),
        ({"spec_hash": bytes(32)}, "not the training the client asked for"),
        ({"transcript_id": bytes(32)}, "not found in store"),
    ):
        with (
            mock.patch.object(client, "task", return_value=dataclasses.replace(task, **changed)),
            pytest.raises(DeliveryError, match=says),
        ):
            fetch_model(client, task_id, store, data_key, out)
    assert not out.exists()
    with pytest.raises(DeliveryError, match="is a directory: name the file to write"):
        fetch_model(client, task_id, store, data_key, tmp_path)
    cancelled = post_task(cfg)
    client.cancel(cancelled)
    with pytest.raises(DeliveryError, match="was cancelled"):
        fetch_model(client, cancelled, store, data_key, out)


@pytest.mark.parametrize("how", ["missing", "altered"])
def test_aTranscriptPublishedWithoutItsFinalCheckpoint_stillGivesTheModel_replayedFromTheLog(
    roles: dict[str, Any],
    post_task: Any,
    make_agents: Any,
    store: Any,
    data_key: bytes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """Auditors replay from the log and read no checkpoint, so a trainer that published its
    transcript without its final checkpoint (or with it altered) was paid, and the client's
    ``fetch_model`` refused: it had paid for a model it could not take. The model is now replayed
    from the transcript, every leaf checked, and is the committed final state bit for bit."""
    from tests.agents.conftest import publish_without_checkpoint

    cfg = small_config(steps=4)
    publish_without_checkpoint(monkeypatch, tmp_path, cfg.steps, how)
    task_id, agents = _committed(roles, post_task, make_agents, cfg)
    got = fetch_model(roles["client"], task_id, store, data_key, tmp_path / "out" / "model.pt")
    t = Transcript(agents.trainer.transcript_dir)  # the trainer's own copy, whole
    state = decode_state(t.load_checkpoint(cfg.steps), cfg)
    weights = torch.load(got.path)
    assert weights.keys() == state.model.state_dict().keys()
    for name, value in state.model.state_dict().items():
        assert torch.equal(weights[name], value.to(weights[name].dtype))
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["model.pt"]  # the unpacked copy went
