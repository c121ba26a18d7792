"""The trained model, as the client takes it: the final state of the committed transcript, held
to what the chain vouches for.

Why: a client pays for a model, and the transcript in the store holds it (its last checkpoint is
the final state, whose state hash the trainer committed as the last leaf), sealed under the client's
data key beside what the client does not need (the rounding log, earlier checkpoints: gigabytes at
paper size). So only the manifest and the last checkpoint are decrypted (``store.SealedArchive``),
and each is checked against the chain: the config against the task's spec hash, the checkpoint
against its last leaf. The model goes out as a PyTorch ``state_dict`` in float32 (every value lies
on the float32 grid, so nothing is lost), which ``model.load_state_dict(torch.load(path))`` reads
into the task's own model class, called as ``model(x)``; a ``.safetensors`` name writes that format.
A Hugging Face or PEFT model can go out as a directory its own ``save_pretrained`` writes
(:func:`write_pretrained`): a LoRA fine-tune's buyer wants the adapter, a few megabytes that
``PeftModel.from_pretrained`` puts onto the base model it already holds, not the whole wrapped model.

Whether the model is beyond dispute is the task's status, not the files': it is reported with it
(a challenge window still open, a game in play, or a game the trainer lost).
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from game import clock
from game.chain.client import VerificationGameClient
from game.chain.types import Task, TaskStatus
from game.errors import DeliveryError, RoundingLogError, TranscriptError
from game.fsio import atomic_write, fsync_dir
from game.store.archive import SealedArchive
from game.store.blobs import BlobStore
from game.store.sealing import StoreError
from game.training.state.leafhash import leaf_of
from game.training.task.config import TaskConfig, load_recorded
from game.training.task.spec import recorded_spec_hash
from game.training.transcript.manifest import Manifest
from game.training.transcript.reader import model_files

if TYPE_CHECKING:
    from torch import nn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeliveredModel:
    """What was written, and how far the chain stands behind it."""

    task_id: int
    path: Path
    preset: str
    steps: int
    values: int  # numbers written (a PEFT adapter's alone, for one written by save_pretrained)
    final_leaf: bytes  # the committed hash of the final state the model comes from
    status: TaskStatus
    trainer_lost: bool  # an auditor showed a step wrong
    live_games: int
    window_ends: int  # unix time

    @property
    def settled(self) -> bool:
        """Finalized with no game lost by the trainer: no one showed the training wrong."""
        return self.status == TaskStatus.FINALIZED and not self.trainer_lost

    def standing(self, now: int) -> str:
        """One sentence on whether the model is beyond dispute yet."""
        if self.trainer_lost:
            return (
                "an auditor showed a step of this training wrong: this is the model the trainer "
                "committed, not one trained as promised"
            )
        if self.settled:
            return "the task is settled: no challenge showed the training wrong"
        if self.live_games:
            return f"{self.live_games} game(s) against this training are still in play"
        if not clock.window_closed(now, self.window_ends):
            return f"the challenge window is open for {clock.seconds_until(now, self.window_ends)} s more"
        return "the challenge window has closed with no game lost; finalize the task to settle it"

    def to_dict(self, now: int) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "path": str(self.path),
            "preset": self.preset,
            "steps": self.steps,
            "values": self.values,
            "final_leaf": self.final_leaf.hex(),
            "status": self.status.name,
            "trainer_lost": self.trainer_lost,
            "live_games": self.live_games,
            "window_ends": self.window_ends,
            "settled": self.settled,
            "standing": self.standing(now),
        }


def _committed(client: VerificationGameClient, task_id: int) -> Task:
    task = client.task(task_id)  # no such task: the client's TaskNotFound
    if task.status == TaskStatus.CANCELLED:
        raise DeliveryError(f"task {task_id} was cancelled: nothing was trained for it")
    if not task.committed:
        raise DeliveryError(
            f"task {task_id} has no commitment yet: the trainer has not committed a trained model"
        )
    return task


def _read_checked(store: BlobStore, key: bytes, task: Task, task_id: int) -> tuple[TaskConfig, bytes | None]:
    """The config and the final state's bytes, each held to the chain; no bytes where the final
    checkpoint is missing or does not hash to the last leaf (:func:`_rebuilt` replays it)."""
    final = task.num_leaves - 1
    manifest_name, ckpt = model_files(final)
    try:
        with SealedArchive(store, key, task.transcript_id) as archive:
            manifest_bytes = archive.read(manifest_name)
            state_bytes: bytes | None = archive.read(ckpt) if ckpt in archive.names() else None
    except StoreError as exc:
        raise DeliveryError(f"cannot read the transcript of task {task_id}: {exc}") from exc
    unusable = f"the transcript of task {task_id} has no usable config"
    try:
        manifest = Manifest.from_json(manifest_bytes, Path(manifest_name))
        recorded = recorded_spec_hash(manifest.config, manifest.inputs)
    except (TranscriptError, ValueError) as exc:
        raise DeliveryError(f"{unusable}: {exc}") from exc
    # held to the task before it is loaded: loading imports the module the config names
    if recorded != task.spec_hash:
        raise DeliveryError(
            f"the transcript's config hashes to {recorded.hex()[:16]}..., task {task_id}'s spec "
            f"hash is {task.spec_hash.hex()[:16]}...: not the training the client asked for"
        )
    try:
        cfg = load_recorded(manifest.config, manifest.inputs)
    except (TranscriptError, ValueError) as exc:
        raise DeliveryError(f"{unusable}: {exc}") from exc
    if cfg.spec_hash() != task.spec_hash:
        raise DeliveryError(
            f"{unusable}: loaded here, it hashes to {cfg.spec_hash().hex()[:16]}..., not to the task's "
            "spec hash (this machine's data, initial weights or task code differ from the trainer's)"
        )
    if state_bytes is None or leaf_of(state_bytes) != task.last_leaf:
        log.warning(
            "task %d: the transcript's final checkpoint (step %d) is %s; the model is rebuilt by "
            "replaying the transcript",
            task_id,
            final,
            "missing" if state_bytes is None else "not the last leaf committed",
        )
        return cfg, None
    return cfg, state_bytes


def _rebuilt(
    store: BlobStore, key: bytes, task: Task, task_id: int, cfg: TaskConfig, profile: str, beside: Path
) -> bytes:
    """The final state, replayed from the transcript with its log on ``profile``, every leaf checked
    on the way. Why: a trainer publishes its checkpoints and nothing on the chain checks them; one
    that leaves the last one out (or alters it) is paid all the same, since every auditor replays
    from the log. The log and an earlier checkpoint (or the initial state) still give the model,
    bit for bit on any machine. The transcript is unpacked in a directory ``beside`` the output
    (it can be gigabytes), removed after."""
    import tempfile

    from game.store.archive import fetch_directory
    from game.training.engine.replay import own_start, replayed
    from game.training.engine.scheduled import states_for
    from game.training.engine.step import engine_for
    from game.training.state.canonical import encode_state
    from game.training.transcript.reader import Transcript

    final = task.num_leaves - 1
    beside.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".vgame-model-", dir=beside) as tmp:
        try:
            fetched = fetch_directory(store, key, task.transcript_id, Path(tmp) / "t")
            t = Transcript(fetched, spec_hash=task.spec_hash)
            if t.manifest.state_root != task.state_root.hex() or t.manifest.log_root != task.log_root.hex():
                raise DeliveryError(f"the transcript of task {task_id} is not the one its roots commit to")
            t.verify()
            engine = engine_for(cfg, profile, checks="rebuild")
            if cfg.scheduled:
                data = states_for(t, engine, [final])[1][final]
            else:
                data = encode_state(replayed(t, engine, own_start(t, engine, final), final))
        except (StoreError, TranscriptError, RoundingLogError) as exc:
            raise DeliveryError(
                f"cannot rebuild the model of task {task_id} from its transcript: {exc}"
            ) from exc
    if leaf_of(data) != task.last_leaf:
        raise DeliveryError(
            f"the final state rebuilt from the transcript does not hash to the last leaf committed for "
            f"task {task_id}"
        )
    return data


def fetch_model(
    client: VerificationGameClient,
    task_id: int,
    store: BlobStore,
    key: bytes,
    out: Path,
    *,
    profile: str = "cpu-1t",
    pretrained: bool = False,
) -> DeliveredModel:
    """Write task ``task_id``'s trained model to ``out`` (a ``state_dict``, whole or not at all; with
    ``pretrained``, the directory the model's own ``save_pretrained`` writes: :func:`write_pretrained`).
    Where the final checkpoint is missing or altered, the model is replayed on ``profile`` from the
    transcript (:func:`_rebuilt`)."""
    import torch  # only once there is a model to write

    from game.training.engine.memory import trimmed
    from game.training.engine.states import decode_state

    if pretrained:
        _check_free(Path(out))
    elif Path(out).is_dir():
        raise DeliveryError(f"{out} is a directory: name the file to write (e.g. {Path(out) / 'model.pt'})")
    task = _committed(client, task_id)
    with trimmed():  # a client script may run on: the state's memory goes back
        cfg, read = _read_checked(store, key, task, task_id)
        state_bytes = (
            read if read is not None else _rebuilt(store, key, task, task_id, cfg, profile, Path(out).parent)
        )
        state = decode_state(state_bytes, cfg)
        del state_bytes
        if pretrained:
            values = write_pretrained(state.model, Path(out))
            del state
            return _delivered(task_id, Path(out), cfg, task, values)
        weights = {
            name: t.detach().to(torch.float32) if t.is_floating_point() else t.detach()
            for name, t in state.model.state_dict().items()
        }
        del state
        from game.training.task.weights import save

        atomic_write(Path(out), save(weights, Path(out)))
        values = sum(t.numel() for t in weights.values())
        del weights
    return _delivered(task_id, Path(out), cfg, task, values)


def _delivered(task_id: int, path: Path, cfg: TaskConfig, task: Task, values: int) -> DeliveredModel:
    return DeliveredModel(
        task_id=task_id,
        path=path,
        preset=cfg.preset,
        steps=task.num_leaves - 1,
        values=values,
        final_leaf=task.last_leaf,
        status=task.status,
        trainer_lost=task.trainer_lost,
        live_games=task.live_games,
        window_ends=task.window_ends,
    )


def _check_free(out: Path) -> None:
    """Refuse a ``save_pretrained`` target that holds something (checked before the state is read:
    that takes seconds at paper size)."""
    if out.is_file() or (out.is_dir() and any(out.iterdir())):
        raise DeliveryError(
            f"{out} exists{' and is not empty' if out.is_dir() else ''}: name a new directory for "
            "save_pretrained to write"
        )


def write_pretrained(model: nn.Module, out: Path) -> int:
    """Write ``model`` (the decoded final state's, float64) to the directory ``out`` by its own
    ``save_pretrained``, cast to float32 in place (every value lies on the float32 grid: nothing is
    lost), whole
    or not at all: a Hugging Face model writes its config and weights (``from_pretrained`` loads
    them), a PEFT model its adapter alone (``PeftModel.from_pretrained(base, out)``). Returns the
    values written. DeliveryError for a model without ``save_pretrained`` or a target not free.

    Why the library's own writer: the names, the config files and the tied or adapter-only tensors
    are what its loader expects, which a file written here would only imitate."""
    import torch
    from safetensors import safe_open

    save = getattr(model, "save_pretrained", None)
    if not callable(save):
        raise DeliveryError(
            f"the task's model ({type(model).__name__}) has no save_pretrained (neither a Hugging Face "
            "nor a PEFT model): write it as a state_dict file instead"
        )
    _check_free(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model.to(torch.float32)
    with tempfile.TemporaryDirectory(prefix=".vgame-pretrained-", dir=out.parent) as tmp:
        staged = Path(tmp) / "model"
        save(str(staged))
        values = 0
        for f in sorted(staged.rglob("*.safetensors")):  # a PEFT model's other adapters: subdirectories
            with safe_open(str(f), framework="pt") as held:
                values += sum(math.prod(held.get_slice(k).get_shape()) for k in held.keys())  # noqa: SIM118 (not iterable)
        if out.is_dir():
            out.rmdir()  # empty (:func:`_check_free`): the staged directory takes its place
        os.replace(staged, out)
    fsync_dir(out.parent)
    return values


__all__ = ["DeliveredModel", "fetch_model", "write_pretrained"]
