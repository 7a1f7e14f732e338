"""Training objectives. The training machinery only uses :func:`build_objective`,
:class:`Objective` and :class:`ObjectiveContext`.

:mod:`.infonce` holds the one contrastive loss (:class:`InfoNCE`; with default parts, unsupervised
SimCSE) and its composition rules; :mod:`.base` the part interfaces; :mod:`.context` the run
context and the per-step cache; :mod:`.spaces` the negative spaces. The papers' parts, one module
each: :mod:`.focal` (Focal-InfoNCE), :mod:`.gaussian` (GS-InfoNCE), :mod:`.off_dropout` and
:mod:`.dcl` (ImSimCSE), :mod:`.barlow` (ImSimCSE's BarlowTwins baseline), :mod:`.mixcse`
(MixCSE), :mod:`.noise` (ImSimCSE's noise ablation), :mod:`.hard_negatives` (supervised
SimCSE's given hard negatives), :mod:`.esimcse` (ESimCSE's word repetition and momentum
queue), :mod:`.mntp` (LLM2Vec's masked next-token prediction, which replaces InfoNCE).
:mod:`.matryoshka` wraps any of them at several prefix
dimensions (Matryoshka Representation Learning). :mod:`.config` is the ``objective:``
section of a run config (torch-free), assembled from :mod:`.sections`: one module per paper with
its sub-section and its checks, beside the paper module of the same name.
:mod:`.registry` is the ordered list of ``(key, paper module's build)`` that assembles the
:class:`InfoNCE` (:mod:`.assembly`) in :func:`build_objective`. :mod:`.papers`: each part names the
papers it implements and describes itself; :func:`objective_papers`, :func:`objective_tags` and
:func:`describe_objective` ask a built objective (the model card and :mod:`cselab.st` use them).
"""

from __future__ import annotations

from ..core.lazy import lazy_exports

#: each public name and its home module, imported on first use: reading the ``objective:``
#: section (:mod:`.config`) needs no torch
_HOMES = {
    "DataKind": "..core.datakind",
    "BarlowTwinsTerm": ".barlow",
    "barlow_twins_loss": ".barlow",
    "cross_correlation": ".barlow",
    "VIEW_ANCHOR": ".base",
    "VIEW_HARD_NEGATIVE": ".base",
    "VIEW_MOMENTUM": ".base",
    "VIEW_OFF_DROPOUT": ".base",
    "VIEW_POSITIVE": ".base",
    "AuxiliaryTerm": ".base",
    "LossTerms": ".base",
    "NegativeBlock": ".base",
    "NegativeSource": ".base",
    "Objective": ".base",
    "Pair": ".base",
    "Score": ".base",
    "ViewTransform": ".base",
    "total_loss": ".base",
    "BarlowTwinsConfig": ".sections.barlow",
    "DCLConfig": ".sections.dcl",
    "FocalConfig": ".sections.focal",
    "GaussianConfig": ".sections.gaussian",
    "MatryoshkaConfig": ".sections.matryoshka",
    "MixCSEConfig": ".sections.mixcse",
    "MomentumQueueConfig": ".sections.esimcse",
    "NoiseConfig": ".sections.noise",
    "ObjectiveConfig": ".config",
    "OffDropoutConfig": ".sections.off_dropout",
    "WordRepetitionConfig": ".sections.esimcse",
    "ObjectiveContext": ".context",
    "StepCache": ".context",
    "DimensionContrastive": ".dcl",
    "dcl_loss": ".dcl",
    "MomentumQueue": ".esimcse",
    "WordRepetition": ".esimcse",
    "FocalScore": ".focal",
    "GaussianNegatives": ".gaussian",
    "HardNegatives": ".hard_negatives",
    "InBatchNegatives": ".infonce",
    "InfoNCE": ".infonce",
    "MATRYOSHKA": ".matryoshka",
    "Matryoshka": ".matryoshka",
    "MatryoshkaPrefixes": ".matryoshka",
    "MixedNegatives": ".mixcse",
    "AdditiveNoise": ".noise",
    "OffDropoutNegatives": ".off_dropout",
    "PositiveRatioScore": ".off_dropout",
    "Cited": ".papers",
    "Paper": ".papers",
    "describe_objective": ".papers",
    "objective_papers": ".papers",
    "objective_tags": ".papers",
    "DROPOUT_SPACE": ".spaces",
    "NOISY_SPACE": ".spaces",
    "OFF_DROPOUT_SPACE": ".spaces",
    "VIEW_ANCHOR_NOISY": ".spaces",
    "VIEW_POSITIVE_NOISY": ".spaces",
    "NegativeSpace": ".spaces",
    "build_objective": ".registry",
    "VIEW_TOKEN_LABELS": ".base",
    "VIEW_TOKEN_LOGITS": ".base",
    "MNTPConfig": ".sections.mntp",
    "MaskedNextTokenPrediction": ".mntp",
    "OBJECTIVE_PARTS": ".registry",
    "Assembly": ".assembly",
    "ObjectiveFacts": ".sections.facts",
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _HOMES)


__all__ = [
    "OBJECTIVE_PARTS",
    "Assembly",
    "ObjectiveFacts",
    "DROPOUT_SPACE",
    "NOISY_SPACE",
    "OFF_DROPOUT_SPACE",
    "VIEW_ANCHOR",
    "VIEW_ANCHOR_NOISY",
    "VIEW_HARD_NEGATIVE",
    "VIEW_MOMENTUM",
    "VIEW_OFF_DROPOUT",
    "VIEW_POSITIVE",
    "VIEW_POSITIVE_NOISY",
    "VIEW_TOKEN_LABELS",
    "VIEW_TOKEN_LOGITS",
    "AdditiveNoise",
    "AuxiliaryTerm",
    "BarlowTwinsConfig",
    "BarlowTwinsTerm",
    "Cited",
    "DCLConfig",
    "DataKind",
    "DimensionContrastive",
    "FocalConfig",
    "FocalScore",
    "GaussianConfig",
    "GaussianNegatives",
    "HardNegatives",
    "InBatchNegatives",
    "InfoNCE",
    "LossTerms",
    "MATRYOSHKA",
    "MNTPConfig",
    "MaskedNextTokenPrediction",
    "Matryoshka",
    "MatryoshkaConfig",
    "MatryoshkaPrefixes",
    "MixCSEConfig",
    "MixedNegatives",
    "MomentumQueue",
    "MomentumQueueConfig",
    "NegativeBlock",
    "NegativeSource",
    "NegativeSpace",
    "NoiseConfig",
    "Objective",
    "ObjectiveConfig",
    "ObjectiveContext",
    "OffDropoutConfig",
    "OffDropoutNegatives",
    "Pair",
    "Paper",
    "PositiveRatioScore",
    "Score",
    "StepCache",
    "ViewTransform",
    "WordRepetition",
    "WordRepetitionConfig",
    "barlow_twins_loss",
    "build_objective",
    "cross_correlation",
    "dcl_loss",
    "describe_objective",
    "objective_papers",
    "objective_tags",
    "total_loss",
]
