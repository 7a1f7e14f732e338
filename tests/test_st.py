"""cselab.st: the objectives as sentence-transformers losses equal cselab's own path, and train."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from sentence_transformers import SentenceTransformer

from conftest import GREEK
from cselab.core.datakind import DataKind
from cselab.core.errors import ConfigError
from cselab.data.inputs import StepInputs
from cselab.model.encoder import SentenceEncoder
from cselab.objectives import (
    DCLConfig,
    FocalConfig,
    GaussianConfig,
    MixCSEConfig,
    ObjectiveConfig,
    ObjectiveContext,
    OffDropoutConfig,
    build_objective,
    total_loss,
)
from cselab.st import (
    CSELoss,
    DCLLoss,
    FocalInfoNCELoss,
    GSInfoNCELoss,
    ImSimCSELoss,
    MixCSELoss,
)
from cselab.training.task import Batch, Task

SENTENCES = [
    " ".join(GREEK[(i * 5 + j * 3) % len(GREEK)] for j in range(2 + i % 6)) for i in range(8)
]

OBJECTIVES = {
    "simcse": ObjectiveConfig(),
    "focal": ObjectiveConfig(focal=FocalConfig(enabled=True)),
    "gaussian": ObjectiveConfig(gaussian=GaussianConfig(enabled=True)),
    "mixcse": ObjectiveConfig(mixcse=MixCSEConfig(enabled=True)),
    "dcl": ObjectiveConfig(dcl=DCLConfig(enabled=True)),
    "imsimcse": ObjectiveConfig(
        off_dropout=OffDropoutConfig(enabled=True), dcl=DCLConfig(enabled=True)
    ),
}


@pytest.fixture(scope="module")
def st_folder(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny BERT with mean pooling saved by cselab: a sentence-transformers folder."""
    folder = tmp_path_factory.mktemp("st") / "model"
    SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg").save(folder)
    return folder


def cselab_reference(folder: Path, config: ObjectiveConfig, seed: int):
    """cselab's trainer path, in float64: the trainer's task on the step-0 batch."""
    # The plain path: sentence-transformers runs the padded forward with nn.Dropout's masks.
    encoder = SentenceEncoder.from_pretrained(str(folder), pooler="avg", fast_path=False)
    encoder = encoder.double().train()
    batch = encoder.tokenize(SENTENCES)
    objective = build_objective(config).double()
    task = Task(encoder, objective, ObjectiveContext(generator=torch.Generator()), seed=42)
    torch.manual_seed(seed)
    loss = total_loss(task(Batch(0, batch)))
    loss.backward()
    grads = {n: p.grad for n, p in encoder.backbone.named_parameters() if p.grad is not None}
    return loss.detach(), grads


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_loss_and_gradients_equal_cselab_path(st_folder: Path, name: str, one_thread) -> None:
    config = OBJECTIVES[name]
    ref_loss, ref_grads = cselab_reference(st_folder, config, seed=7)
    model = SentenceTransformer(str(st_folder), device="cpu").double().train()
    loss_fn = CSELoss(model, config, seed=42)
    features = [model.tokenize(SENTENCES), model.tokenize(SENTENCES)]
    torch.manual_seed(7)  # the same dropout masks as the reference
    loss = loss_fn(features, None)
    loss.backward()
    grads = {n: p.grad for n, p in model[0].auto_model.named_parameters() if p.grad is not None}
    eps = torch.finfo(torch.float64).eps
    torch.testing.assert_close(loss.detach(), ref_loss, rtol=1e4 * eps, atol=0)
    assert grads.keys() == ref_grads.keys()
    for key, ref in ref_grads.items():
        tol = 1e4 * eps * float(ref.abs().max().clamp_min(1e-30))
        torch.testing.assert_close(grads[key], ref, rtol=0, atol=tol, msg=key)
    # and the dropout masks matter: another seed gives another loss
    torch.manual_seed(8)
    assert not torch.equal(loss_fn(features, None).detach(), loss.detach())


HARD_NEGATIVE_OBJECTIVES = {
    "simcse": ObjectiveConfig(),
    "weighted": ObjectiveConfig(hard_negative_weight=0.7),
    "focal": ObjectiveConfig(focal=FocalConfig(enabled=True), hard_negative_weight=-0.3),
    "gaussian": ObjectiveConfig(gaussian=GaussianConfig(enabled=True)),
    "mixcse": ObjectiveConfig(mixcse=MixCSEConfig(enabled=True)),
    "dcl": ObjectiveConfig(dcl=DCLConfig(enabled=True), hard_negative_weight=0.5),
}
POSITIVES = SENTENCES[1:] + SENTENCES[:1]
NEGATIVES = [f"{s} {GREEK[i]}" for i, s in enumerate(SENTENCES[::-1])]  # other widths


def pairs_task_reference(folder: Path, config: ObjectiveConfig, seed: int):
    """cselab's pairs task with hard negatives (a pairs file with a negative column), float64:
    the batch the trainer builds (anchors, positives, and negatives ``(B, 1, L)``)."""
    encoder = SentenceEncoder.from_pretrained(str(folder), pooler="avg", fast_path=False)
    encoder = encoder.double().train()
    batch = StepInputs(
        dict(encoder.tokenize(SENTENCES)),
        dict(encoder.tokenize(POSITIVES)),
        {k: v[:, None] for k, v in encoder.tokenize(NEGATIVES).items()},
    )
    kind = DataKind(pairs=True, negatives=1)
    objective = build_objective(config, kind).double()
    task = Task(
        encoder, objective, ObjectiveContext(generator=torch.Generator()), seed=42, kind=kind
    )
    torch.manual_seed(seed)
    losses = task(Batch(0, batch))
    loss = total_loss(losses)
    loss.backward()
    grads = {n: p.grad for n, p in encoder.backbone.named_parameters() if p.grad is not None}
    return loss.detach(), grads, {k: v.detach() for k, v in losses.items()}


@pytest.mark.parametrize("name", list(HARD_NEGATIVE_OBJECTIVES))
def test_three_columns_equal_the_pairs_task_with_hard_negatives(
    st_folder: Path, name: str, one_thread
) -> None:
    """A third column is the trainer's negative column: the same loss terms and gradients as
    ``Task.losses`` of cselab's pairs task with hard negatives, with the same dropout masks."""
    config = HARD_NEGATIVE_OBJECTIVES[name]
    ref_loss, ref_grads, ref_terms = pairs_task_reference(st_folder, config, seed=7)
    model = SentenceTransformer(str(st_folder), device="cpu").double().train()
    loss_fn = CSELoss(model, config, seed=42)
    features = [model.tokenize(SENTENCES), model.tokenize(POSITIVES), model.tokenize(NEGATIVES)]
    torch.manual_seed(7)
    loss = loss_fn(features, None)
    loss.backward()
    eps = torch.finfo(torch.float64).eps
    assert loss_fn.last_terms.keys() == ref_terms.keys()
    for key, ref in ref_terms.items():
        torch.testing.assert_close(loss_fn.last_terms[key], ref, rtol=1e4 * eps, atol=0, msg=key)
    torch.testing.assert_close(loss.detach(), ref_loss, rtol=1e4 * eps, atol=0)
    grads = {n: p.grad for n, p in model[0].auto_model.named_parameters() if p.grad is not None}
    assert grads.keys() == ref_grads.keys()
    for key, ref in ref_grads.items():
        tol = 1e4 * eps * float(ref.abs().max().clamp_min(1e-30))
        torch.testing.assert_close(grads[key], ref, rtol=0, atol=tol, msg=key)
    # The hard negatives count: without them (two columns) the loss is another one.
    if config.hard_negative_weight == 0:
        torch.manual_seed(7)
        assert not torch.allclose(loss_fn(features[:2], None).detach(), loss.detach())


def test_the_model_is_left_as_it_was_given(st_folder: Path, one_thread) -> None:
    """After a loss forward and backward the user's model has the same module objects of the
    same types, and in training mode it draws the same dropout masks as before (nn.Dropout's)."""
    model = SentenceTransformer(str(st_folder), device="cpu").train()
    features = model.tokenize(SENTENCES)
    modules = [(name, m, type(m)) for name, m in model.named_modules()]

    def output() -> torch.Tensor:
        torch.manual_seed(3)
        with torch.no_grad():
            return model(dict(features))["sentence_embedding"]

    before = output()
    for make in (CSELoss, ImSimCSELoss):
        loss_fn = make(model)
        loss_fn([model.tokenize(SENTENCES), model.tokenize(SENTENCES)], None).backward()
    CSELoss(model)([model.tokenize(SENTENCES), model.tokenize(POSITIVES),
                    model.tokenize(NEGATIVES)], None).backward()  # fmt: skip
    assert [(name, m, type(m)) for name, m in model.named_modules()] == modules
    assert model.training and all(m.training for _, m, _ in modules)
    assert torch.equal(output(), before)


def test_named_losses_build_the_configs(st_folder: Path) -> None:
    model = SentenceTransformer(str(st_folder), device="cpu")
    assert FocalInfoNCELoss(model, hardness=0.2).config == ObjectiveConfig(
        focal=FocalConfig(enabled=True, hardness=0.2)
    )
    assert GSInfoNCELoss(model).config == OBJECTIVES["gaussian"]
    assert MixCSELoss(model).config == OBJECTIVES["mixcse"]
    assert DCLLoss(model).config == OBJECTIVES["dcl"]
    assert ImSimCSELoss(model).config == OBJECTIVES["imsimcse"]
    assert "xu2023imsimcse" in ImSimCSELoss(model).citation
    with pytest.raises(ValueError, match=r"objective.focal.hardness must be in \[0, 1\]"):
        FocalInfoNCELoss(model, hardness=2.0)


def test_a_paper_loss_takes_every_field_of_its_sections_under_its_key_path(
    st_folder: Path,
) -> None:
    """The keywords are the sections' fields (none renamed by hand, none left out): the first
    section's bare, a name the objective section has or a further section's as ``key_field``."""
    expected = {
        FocalInfoNCELoss: ["hardness"],
        GSInfoNCELoss: ["num", "batch_multiple", "mean", "std", "weight"],
        MixCSELoss: ["mix_ratio", "directions", "partner", "columns", "stop_gradient"],
        DCLLoss: ["weight", "dcl_temperature", "formulation", "eps"],
        ImSimCSELoss: ["tradeoff", "variant", "dcl_weight", "dcl_temperature",
                       "dcl_formulation", "dcl_eps"],
    }  # fmt: skip
    for loss, words in expected.items():
        params = list(inspect.signature(loss).parameters)
        assert params == ["model", "temperature", *words, "seed", "mini_batch_size"], loss
    model = SentenceTransformer(str(st_folder), device="cpu")
    built = ImSimCSELoss(model, 0.1, dcl_eps=1e-3, dcl_formulation="paper", variant="authors_code")
    assert built.config == ObjectiveConfig(
        temperature=0.1,
        off_dropout=OffDropoutConfig(enabled=True, variant="authors_code"),
        dcl=DCLConfig(enabled=True, eps=1e-3, formulation="paper"),
    )
    with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
        DCLLoss(model, temprature=0.1)
    with pytest.raises(TypeError) as err:  # before: "paper_loss.<locals>.__init__() takes..."
        DCLLoss(model, 0.05, 0.2)
    assert str(err.value) == (
        "DCLLoss() takes model and temperature by position and the rest by keyword (weight=, "
        "dcl_temperature=, formulation=, eps=); got 1 more by position"
    )
    with pytest.raises(TypeError, match=r"^DCLLoss\.__init__\(\) got multiple values for argument"):
        DCLLoss(model, 0.05, temperature=0.1)


def test_caching_and_undefined_combinations_are_refused_with_a_reason(st_folder: Path) -> None:
    model = SentenceTransformer(str(st_folder), device="cpu")
    triplets = [model.tokenize(SENTENCES), model.tokenize(SENTENCES[1:] + SENTENCES[:1]),
                model.tokenize(SENTENCES[::-1])]  # fmt: skip
    with pytest.raises(ConfigError, match="off_dropout is defined for the dropout views"):
        ImSimCSELoss(model)(triplets, None)
    weighted = CSELoss(model, ObjectiveConfig(hard_negative_weight=1.0))
    with pytest.raises(ConfigError, match="hard_negative_weight=1.0 .* the batch has two columns"):
        weighted(triplets[:2], None)
    assert torch.isfinite(weighted(triplets, None))
    with pytest.raises(ValueError, match="takes two or three text columns"):
        CSELoss(model)(triplets + triplets[:1], None)
    with pytest.raises(NotImplementedError, match="cache_chunk_size"):
        CSELoss(model, mini_batch_size=4)
    pairs = [model.tokenize(SENTENCES), model.tokenize(SENTENCES[::-1])]
    with pytest.raises(ValueError, match="off-dropout negatives are defined for"):
        ImSimCSELoss(model)(pairs, None)
    # (anchor, positive) pairs with different texts are fine for the others
    assert torch.isfinite(FocalInfoNCELoss(model)(pairs, None))


@pytest.mark.parametrize(
    "make",
    [FocalInfoNCELoss, GSInfoNCELoss, MixCSELoss, DCLLoss, ImSimCSELoss],
    ids=lambda c: c.__name__,
)
def test_sentence_transformers_trainer_lowers_the_loss_and_saves(
    st_folder: Path, tmp_path: Path, make: type, one_thread
) -> None:
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )

    torch.manual_seed(0)
    model = SentenceTransformer(str(st_folder), device="cpu")
    loss = make(model)
    texts = [
        " ".join(GREEK[(i * 7 + j * 5) % len(GREEK)] for j in range(3 + i % 7)) for i in range(320)
    ]
    probe = [model.tokenize(texts[:32]), model.tokenize(texts[:32])]

    def probe_loss() -> float:
        model.train()
        torch.manual_seed(123)  # the same dropout masks before and after
        with torch.no_grad():
            return float(loss(probe, None))

    before = probe_loss()
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=16,
        max_steps=20,
        learning_rate=1e-3,
        save_strategy="no",
        report_to="none",
        logging_steps=10,
        use_cpu=True,
        seed=0,
        dataloader_drop_last=True,
    )
    data = Dataset.from_dict({"anchor": texts, "positive": texts})
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss)
    trainer.train()
    assert trainer.state.global_step == 20
    after = probe_loss()
    print(f"{make.__name__}: probe loss {before:.4f} -> {after:.4f}")
    assert after < before - 0.1, (before, after)
    model.save(str(tmp_path / "saved"))
    reloaded = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    a, b = model.encode(texts[:4]), reloaded.encode(texts[:4])
    tol = 1e3 * torch.finfo(torch.float32).eps * float(abs(a).max())
    assert abs(a - b).max() <= tol
