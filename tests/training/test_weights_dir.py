"""Initial weights from a model directory or a shard index, as Hugging Face checkpoints come.

Why: a task fine-tuning a Hugging Face model has its checkpoint as ``save_pretrained`` wrote it (a
directory; a model over the shard size in several ``.safetensors`` files and an index), with a tied
output layer stored once. ``init_weights`` took one file only, and a strict load refused the tied
tensor as missing. Now a directory or an index is read shard by shard, and a tensor the model ties
to a given one counts as given.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from game.errors import ConfigError
from game.training.dispatch.initmode import init_module
from game.training.task import weights
from tests.training.test_task_api import TASK_PY, trains_and_audits

transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")


def _gpt2(seed: int) -> nn.Module:
    config = transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=2, n_head=2)
    return init_module(lambda: transformers.GPT2LMHeadModel(config), seed=seed)


@pytest.mark.parametrize("shard", ["5GB", "6KB"])
def test_aSavedPretrainedCheckpoint_oneFileOrSharded_loadsAsItsStateDict_tiedOutputIncluded(
    tmp_path: Path, shard: str
) -> None:
    trained, fresh = _gpt2(1), _gpt2(2)
    trained.save_pretrained(tmp_path / "ckpt", max_shard_size=shard)
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert ("model.safetensors.index.json" in files) == (shard == "6KB")
    state = trained.state_dict()
    given = weights.load(tmp_path / "ckpt")
    assert "lm_head.weight" not in given  # stored once, as the input embedding
    assert all(torch.equal(given[n], state[n]) for n in given)
    weights.apply(fresh, tmp_path / "ckpt", strict=True)  # the tied lm_head counts as given
    assert all(torch.equal(t, state[n]) for n, t in fresh.state_dict().items())
    alone = {n: t for n, t in state.items() if n != "lm_head.weight"}
    assert weights.digest(tmp_path / "ckpt") == weights.digest(alone)  # by value, however stored
    if shard == "6KB":
        assert weights.digest(tmp_path / "ckpt" / "model.safetensors.index.json") == weights.digest(alone)


def test_aStrictLoad_stillRefusesATensorThatIsNotTiedAndNotGiven(tmp_path: Path) -> None:
    state = {n: t for n, t in _gpt2(1).state_dict().items() if n != "transformer.ln_f.bias"}
    with pytest.raises(ConfigError, match=r"no values for transformer\.ln_f\.bias"):
        weights.apply(_gpt2(2), state, strict=True)


def _index(root: Path, weight_map: object) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda r: r.mkdir(), "a directory with none of model.safetensors"),
        (lambda r: _index(r, {"w": "shard-1.safetensors"}), "its shard shard-1.safetensors is missing"),
        (lambda r: _index(r, {"w": "../elsewhere.safetensors"}), "is not a file beside the index"),
        (lambda r: _index(r, ["w"]), "its weight_map is not names of shard files"),
    ],
)
def test_aBrokenCheckpointDirectory_isAConfigErrorSayingWhat(tmp_path: Path, make: object, said: str) -> None:
    make(tmp_path / "ckpt")  # type: ignore[operator]
    with pytest.raises(ConfigError, match=said):
        weights.load(tmp_path / "ckpt")


def test_aShardLackingATensorItsIndexNames_isRefused(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    root = _index(tmp_path / "ckpt", {"a": "s.safetensors", "b": "s.safetensors"})
    save_file({"a": torch.ones(2)}, str(root / "s.safetensors"))
    with pytest.raises(ConfigError, match=r"shard s\.safetensors lacks b"):
        weights.load(root)


def test_aTaskFineTunedFromAShardedCheckpoint_trainsAndAudits(tmp_path: Path) -> None:
    """A user's task whose ``init_weights`` is a directory of shards (huggingface_hub's
    ``save_torch_state_dict``), through train and audit."""
    state = {
        "a.weight": torch.linspace(-1, 1, 32).reshape(8, 4),
        "a.bias": torch.zeros(8),
        "b.weight": torch.linspace(1, -1, 24).reshape(3, 8),
        "b.bias": torch.zeros(3),
    }
    body = TASK_PY.replace(
        "init_weights=(HERE / cfg.params.init) if cfg.params.init else None", "init_weights=HERE / 'ckpt'"
    )
    assert "HERE / 'ckpt'" in body

    def checkpoint(package: Path) -> None:
        (package / "ckpt").mkdir()
        huggingface_hub.save_torch_state_dict(state, package / "ckpt", max_shard_size=200)
        assert (package / "ckpt" / "model.safetensors.index.json").is_file()

    trains_and_audits(tmp_path, body, prepare=checkpoint)


def _bert(cls: str, seed: int) -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=3,
    )  # fmt: skip
    return init_module(lambda: getattr(transformers, cls)(config), seed=seed)


def test_aBaseModelsCheckpoint_fitsAModelWithAHead_andBack_byTheBaseModelPrefix(tmp_path: Path) -> None:
    """As ``from_pretrained`` does: a ``BertModel`` checkpoint (names without ``bert.``) fine-tunes a
    ``BertForSequenceClassification`` (its new head from its own initialisation), and that model's
    ``bert.`` tensors load into a ``BertModel``."""
    base = _bert("BertModel", 1)
    base.save_pretrained(tmp_path / "base")
    headed = _bert("BertForSequenceClassification", 2)
    weights.apply(headed, tmp_path / "base", strict=False)
    assert all(torch.equal(t, headed.state_dict()[f"bert.{n}"]) for n, t in base.state_dict().items())
    with pytest.raises(ConfigError, match="no values for classifier"):
        weights.apply(_bert("BertForSequenceClassification", 3), tmp_path / "base", strict=True)

    body = {n: t for n, t in headed.state_dict().items() if n.startswith("bert.")}
    again = _bert("BertModel", 4)
    weights.apply(again, body, strict=True)
    assert all(torch.equal(t, body[f"bert.{n}"]) for n, t in again.state_dict().items())
    with pytest.raises(ConfigError, match=r"the model has no bert\."):  # a head it does not have: no fit
        weights.apply(_bert("BertModel", 5), headed.state_dict(), strict=False)


def test_aCheckpointsVocabulary_givesTheFirstRowsOfAVocabularyGrownInTheFactory(tmp_path: Path) -> None:
    """Fine-tuning with special tokens added (``resize_token_embeddings(34, mean_resizing=False)`` in
    the factory) was refused: the checkpoint's embedding has 32 rows, the model's 34. As
    ``from_pretrained`` then resizing does, the given rows are the first ones and the added ones
    keep the model's own initialisation; the tied output layer follows. Any other tensor, or a
    vocabulary with more rows than the model's, is refused as before."""
    trained = _gpt2(1)
    trained.save_pretrained(tmp_path / "ckpt")

    def grown() -> nn.Module:
        config = transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=2, n_head=2)
        model = transformers.GPT2LMHeadModel(config)
        model.resize_token_embeddings(34, mean_resizing=False)
        return model

    model = init_module(grown, seed=2)
    added = model.transformer.wte.weight[32:].detach().clone()
    weights.apply(model, tmp_path / "ckpt", strict=True)
    wte = model.transformer.wte.weight
    assert torch.equal(wte[:32], trained.transformer.wte.weight) and torch.equal(wte[32:], added)
    assert model.lm_head.weight is wte or torch.equal(model.lm_head.weight, wte)
    others = {
        n: t for n, t in trained.state_dict().items() if n not in ("transformer.wte.weight", "lm_head.weight")
    }
    assert all(torch.equal(model.state_dict()[n], t) for n, t in others.items())

    shrunk = dict(trained.state_dict())
    shrunk["transformer.h.0.mlp.c_fc.weight"] = shrunk["transformer.h.0.mlp.c_fc.weight"][:8]
    with pytest.raises(ConfigError, match=r"c_fc\.weight has shape \(8, 64\), the model's is \(16, 64\)"):
        weights.apply(init_module(grown, seed=2), shrunk, strict=False)
    bigger = {"transformer.wte.weight": torch.zeros(40, 16, dtype=torch.float64)}
    with pytest.raises(ConfigError, match=r"wte\.weight has shape \(40, 16\)"):
        weights.apply(init_module(grown, seed=2), bigger, strict=False)
