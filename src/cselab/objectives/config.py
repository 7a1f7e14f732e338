"""Configuration of the training objective (the ``objective:`` section of a run config).

The defaults are unsupervised SimCSE (Gao et al. 2021, Eq. 1). Each paper's change is a
sub-section with an ``enabled`` switch; any combination of switches is a defined objective (see
``docs/objectives.md`` for the composition rules), and combinations that would be ambiguous are
rejected by :meth:`ObjectiveConfig.validate` with a message saying why.

The papers reuse symbols (``m`` is Focal's hardness and ImSimCSE's trade-off; ``λ`` is
GS-InfoNCE's noise weight, MixCSE's mixing ratio and ImSimCSE's DCL weight), so the config keys use
distinct names::

    objective:
      temperature: 0.05
      focal: {enabled: true, hardness: 0.3}                       # Hou & Li 2023, Eq. 2
      gaussian: {enabled: true, batch_multiple: 3.0, weight: 1.0}  # Wu et al., Eq. 5
      off_dropout: {enabled: true, tradeoff: 0.9}                  # Xu et al. 2023, Eq. 3
      dcl: {enabled: true, weight: 0.1, temperature: 5.0}          # Xu et al. 2023, Eq. 5-6
      barlow_twins: {enabled: true, padding: 704}                  # Xu et al. 2023, Eq. 4
      mixcse: {enabled: true, mix_ratio: 0.2}                      # Zhang et al. 2022
      noise: {enabled: true, side: negative}                       # Xu et al. 2023, Table 1
      word_repetition: {enabled: true, dup_rate: 0.32}             # Wu et al. 2022, Sec. 3.1
      momentum_queue: {enabled: true, queue_size: 160, momentum: 0.995}  # Wu et al. 2022, Sec. 3.2
      hard_negative_weight: 0.0          # pairs with hard negatives: Gao et al. 2021, Sec. 4
      matryoshka: {dims: [384, 256, 128, 64]}                      # Kusupati et al. 2022, Eq. 1
      mntp: {enabled: true, mask_ratio: 0.2}     # instead of InfoNCE: BehnamGhader et al. 2024
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

from ..core.schema import ConfigError, check, check_kinds, finite

#: the root of every key named in this section's messages
_P = "objective"


@dataclass
class FocalConfig:
    """Focal-InfoNCE (Hou & Li 2023, Eq. 2): positives score ``s²``, negatives ``s(s+m)``.

    Attributes:
        enabled: use Focal's score for every column (in-batch, Gaussian, mixed, off-dropout).
        hardness: ``m``; negatives with cosine above ``1 - m`` are up-weighted. Paper: 0.3
            (Table 5 searches 0.1-0.4). Must be in ``[0, 1]``.
    """

    enabled: bool = False
    hardness: float = 0.3

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.focal``."""
        check(finite(self.hardness) and 0 <= self.hardness <= 1,
              f"{_P}.focal.hardness must be in [0, 1]", self.hardness)  # fmt: skip


@dataclass
class GaussianConfig:
    """GS-InfoNCE (Wu et al., Eq. 5): ``M`` Gaussian vectors as extra negatives, weight ``λ``.

    Attributes:
        enabled: add the Gaussian negatives.
        num: ``M``, the number of noise vectors per step; ``null`` means
            ``round(batch_multiple × global batch size)``.
        batch_multiple: ``M`` as a multiple of the (global) batch size when ``num`` is null.
            Paper: 3 (Table 3), i.e. 192 at batch 64, as in the authors' scripts.
        mean: ``μ`` of every coordinate of ``g_k`` (paper: 0).
        std: ``σ`` (paper: 1). With ``mean = 0``, ``σ`` has no effect: the cosine similarity
            is scale invariant and ``g/σ`` is standard normal.
        weight: ``λ`` (paper: 1), applied exactly as a factor on the Gaussian terms of the
            denominator; ``0`` removes them.
    """

    enabled: bool = False
    num: int | None = None
    batch_multiple: float = 3.0
    mean: float = 0.0
    std: float = 1.0
    weight: float = 1.0

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.gaussian``."""
        g = self
        check(g.num is None or g.num >= 0, f"{_P}.gaussian.num must be >= 0 or null", g.num)
        check(finite(g.batch_multiple) and g.batch_multiple >= 0,
               f"{_P}.gaussian.batch_multiple must be >= 0", g.batch_multiple)  # fmt: skip
        check(finite(g.mean), f"{_P}.gaussian.mean must be finite", g.mean)
        check(_positive(g.std), f"{_P}.gaussian.std must be > 0", g.std)
        check(finite(g.weight) and g.weight >= 0, f"{_P}.gaussian.weight must be >= 0", g.weight)


@dataclass
class OffDropoutConfig:
    """ImSimCSE's off-dropout negatives (Xu et al. 2023, Eq. 3).

    Needs the ``off`` view: one more forward pass of the batch with all dropout switched off.

    Attributes:
        enabled: score every negative column between off-dropout representations.
        tradeoff: ``m`` (paper: 0.9, Table 5).
        variant: ``paper`` multiplies the negative sum by ``m`` (Eq. 3). ``authors_code``
            follows the released code instead: no weight on the negatives and the *positive*
            logit multiplied by ``m`` both in the numerator and inside the log-sum-exp (this is a
            different objective: a temperature ``τ/m`` for the positive column only).
    """

    enabled: bool = False
    tradeoff: float = 0.9
    variant: Literal["paper", "authors_code"] = "paper"

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.off_dropout``; it is defined for sentences only."""
        check(_positive(self.tradeoff), f"{_P}.off_dropout.tradeoff must be > 0", self.tradeoff)
        if (facts.pairs or facts.hard_negatives) and self.enabled:
            raise ConfigError(
                f"{_P}.off_dropout is defined for the dropout views of one sentence (ImSimCSE, "
                "Xu et al. 2023, Sec. 3.2: the negatives are the batch's sentences encoded "
                "without dropout); with given pairs the positive is another sentence and the "
                "paper defines no off-dropout objective for it: disable it for pairs data"
            )


@dataclass
class DCLConfig:
    """ImSimCSE's dimension-wise contrastive learning (Xu et al. 2023, Eq. 5), weight ``λ``.

    Attributes:
        enabled: add ``weight × ℓ_DCL`` as the term ``dcl``.
        weight: ``λ`` of Eq. 6 (paper: 0.1, Table 5).
        temperature: ``τ_DCL`` (paper: 5, Table 5).
        formulation: ``authors_code`` (default; the scale on which the paper's ``τ_DCL = 5`` and
            ``λ = 0.1`` were tuned): standardise with the biased batch variance (BatchNorm
            without affine), divide the similarity by the batch size and *average* the loss
            over dimensions. ``paper``: the literal Eq. 5: unbiased standard deviation, no
            division by the batch size, loss *summed* over dimensions. At batch ``N`` and width
            ``D`` the two agree when ``τ_paper = (N-1)·τ_code`` and ``λ_paper = λ_code / D``.
        eps: added to the variance before the square root (BatchNorm's 1e-5), in both forms.
    """

    enabled: bool = False
    weight: float = 0.1
    temperature: float = 5.0
    formulation: Literal["authors_code", "paper"] = "authors_code"
    eps: float = 1e-5

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.dcl``."""
        d = self
        check(finite(d.weight) and d.weight >= 0, f"{_P}.dcl.weight must be >= 0", d.weight)
        check(_positive(d.temperature), f"{_P}.dcl.temperature must be > 0", d.temperature)
        check(_positive(d.eps), f"{_P}.dcl.eps must be > 0", d.eps)


@dataclass
class BarlowTwinsConfig:
    """BarlowTwins as an additive term (Xu et al. 2023, Eq. 4, Table 2; Zbontar et al. 2021).

    ``weight × [Σ_c (1 - C_cc)² + λ_BT Σ_{c≠d} C_cd²]`` with ``C`` the cross-correlation of the
    two views over the batch (the paper's leading minus sign is a typo: the term is minimised).

    Attributes:
        enabled: add the term ``barlow_twins``.
        weight: factor on the whole term (the paper does not report it; 1.0).
        off_diagonal: ``λ_BT`` (BarlowTwins' 5e-3).
        padding: ``M`` standard-Gaussian artificial embeddings appended to the batch before
            computing ``C`` (Table 2: 100, 300, 704); the same rows pad both views.
        center: subtract each dimension's batch mean first (BarlowTwins' batch standardisation).
            ``false`` is Eq. 4 as printed (cosine similarity between dimension columns).
    """

    enabled: bool = False
    weight: float = 1.0
    off_diagonal: float = 5e-3
    padding: int = 0
    center: bool = False

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.barlow_twins``."""
        b = self
        check(finite(b.weight) and b.weight >= 0, f"{_P}.barlow_twins.weight must be >= 0",
               b.weight)  # fmt: skip
        check(finite(b.off_diagonal) and b.off_diagonal >= 0,
               f"{_P}.barlow_twins.off_diagonal must be >= 0", b.off_diagonal)  # fmt: skip
        check(b.padding >= 0, f"{_P}.barlow_twins.padding must be >= 0", b.padding)


@dataclass
class MixCSEConfig:
    """MixCSE (Zhang et al. 2022): mixed hard negatives ``normalize(λh'_i + (1-λ)h'_j)``.

    Attributes:
        enabled: add the mixed negatives.
        mix_ratio: ``λ``, the weight of the anchor's own positive in the mix (paper: 0.2);
            must be in ``[0, 1)``.
        directions: ``both`` (paper): both views serve as anchor, each with its own mixed
            negatives (the objective becomes symmetric). ``single``: only the first view is an
            anchor (MixCSE_single, Table 3); requires ``objective.symmetric: false``.
        partner: how ``j`` is chosen: ``random`` (a uniformly drawn other sentence of the global
            batch, fresh each step) or ``next`` (``j = i + 1`` modulo the batch, the authors'
            rolled batch).
        columns: ``one`` (paper, L_mix): one mixed negative per anchor. ``all`` (the authors'
            code): the ``N`` rolled mixes are columns for every anchor, and the mix whose
            ``(1 - λ)`` part is the anchor's own positive is removed (``-inf``; the code
            multiplied its logit by 0 instead, leaving ``e⁰`` in the denominator). ``all``
            requires ``partner: next``.
        stop_gradient: no gradient through the mixed negatives (paper); ``false`` is
            MixCSE_wo_sg (Table 3).
    """

    enabled: bool = False
    mix_ratio: float = 0.2
    directions: Literal["both", "single"] = "both"
    partner: Literal["random", "next"] = "random"
    columns: Literal["one", "all"] = "one"
    stop_gradient: bool = True

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.mixcse``, with ``objective.symmetric``."""
        x = self
        check(finite(x.mix_ratio) and 0 <= x.mix_ratio < 1,
               f"{_P}.mixcse.mix_ratio must be in [0, 1)", x.mix_ratio)  # fmt: skip
        if x.enabled and x.directions == "single" and facts.objective.symmetric:
            raise ConfigError(
                f"{_P}.mixcse.directions='single' uses only the first view as anchor, which "
                f"contradicts {_P}.symmetric=true; use directions='both' for a symmetric loss"
            )
        if x.enabled and x.columns == "all" and x.partner != "next":
            raise ConfigError(
                f"{_P}.mixcse.columns='all' is the authors' rolled construction and needs "
                f"{_P}.mixcse.partner='next' (got '{x.partner}')"
            )


@dataclass
class NoiseConfig:
    """ImSimCSE's noise ablation (Xu et al. 2023, Table 1, "+Noise" rows).

    Adds ``N(0, variance)`` noise to each raw embedding (independently per view and step)
    before the similarities of the chosen side are computed; the other side stays clean.

    Attributes:
        enabled: perturb the embeddings.
        side: ``positive`` (``s(z¹+g¹, z²+g²)`` replaces the positive pair), ``negative``
            (the negatives become ``s(z_i¹+g¹, z_j²+g²)``) or ``both``.
        variance: the noise variance (paper: 0.1).
    """

    enabled: bool = False
    side: Literal["positive", "negative", "both"] = "negative"
    variance: float = 0.1

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.noise``: noisy negatives need every negative to have a
        noise view (not off-dropout, the momentum queue or given hard negatives)."""
        n = self
        check(finite(n.variance) and n.variance >= 0, f"{_P}.noise.variance must be >= 0",
               n.variance)  # fmt: skip
        noisy_negatives = n.enabled and n.side in ("negative", "both")
        if noisy_negatives and facts.hard_negatives:
            raise ConfigError(
                f"{_P}.noise.side='{n.side}' perturbs the dropout views z1/z2 (ImSimCSE Table 1); "
                "given hard negatives have no such view, so the negative side would be half "
                "noisy: use noise.side='positive' with hard negatives"
            )
        if noisy_negatives and facts.objective.off_dropout.enabled:
            raise ConfigError(
                f"{_P}.noise.side='{n.side}' adds noise to the negatives, but "
                f"{_P}.off_dropout scores the negatives on noise-free off-dropout representations; "
                "enable only one of them, or use noise.side='positive'"
            )
        if noisy_negatives and facts.objective.momentum_queue.enabled:
            raise ConfigError(
                f"{_P}.noise.side='{n.side}' adds noise to the negatives, but the entries of "
                f"{_P}.momentum_queue are momentum-encoded sentences without a noise view, so the "
                "negative side would be half noisy: use noise.side='positive' with the queue"
            )


# --- Matryoshka (Kusupati et al. 2022): wraps whichever objective the other keys describe -----


@dataclass
class MatryoshkaConfig:
    """Matryoshka Representation Learning (Kusupati et al. 2022, Eq. 1): the objective the other
    keys describe, computed on the first ``d`` coordinates of every view for each ``d`` of
    ``dims`` and summed with ``weights``, so the model can be cut to any of those dimensions.

    Attributes:
        dims: the prefix dimensions, e.g. ``[384, 256, 128, 64]`` (any order; each at least 1,
            no repeats, none above the encoder's output width); ``null`` (default): off. List
            the full width too, or the full vector is not trained (sentence-transformers warns
            of the same).
        weights: ``c_d``, one factor per entry of ``dims`` (each ``>= 0``, at least one
            ``> 0``); ``null``: 1 each (the paper's setting).
    """

    dims: list[int] | None = None
    weights: list[float] | None = None

    @property
    def enabled(self) -> bool:
        return self.dims is not None

    def validate(self, facts: ObjectiveFacts | None = None, *, width: int | None = None) -> None:
        """The checks of ``objective.matryoshka`` (kinds are checked by the whole section);
        the encoder's output width (``facts.width`` or ``width``) where it is known (``None``:
        not yet)."""
        if facts is not None and width is None:
            width = facts.width
        p = "objective.matryoshka"
        if self.dims is None:
            check(self.weights is None, f"{p}.weights is set but {p}.dims is null; list the "
                  "dimensions the weights belong to", self.weights)  # fmt: skip
            return
        check(len(self.dims) > 0, f"{p}.dims must list at least one dimension (or be null)",
              self.dims)  # fmt: skip
        check(all(d >= 1 for d in self.dims), f"{p}.dims must all be >= 1", self.dims)
        check(len(set(self.dims)) == len(self.dims), f"{p}.dims must not repeat a dimension",
              self.dims)  # fmt: skip
        if self.weights is not None:
            check(len(self.weights) == len(self.dims),
                  f"{p}.weights must have one entry per dimension ({len(self.dims)})",
                  self.weights)  # fmt: skip
            check(all(finite(w) and w >= 0 for w in self.weights), f"{p}.weights must all be "
                  ">= 0", self.weights)  # fmt: skip
            check(any(w > 0 for w in self.weights), f"{p}.weights must not all be 0 (no "
                  "loss would be left)", self.weights)  # fmt: skip
        if width is not None:
            check(max(self.dims) <= width, f"{p}.dims must not exceed the encoder's output "
                  f"width {width}", self.dims)  # fmt: skip


# --- end of Matryoshka --------------------------------------------------------------------------


@dataclass
class WordRepetitionConfig:
    """ESimCSE's word repetition (Wu et al. 2022, Sec. 3.1): the positive view of a sentence is
    the sentence with some of its subword tokens written twice, so the pair differs in length.

    Done as the authors' code does (``--dup_type bpe``): on the token ids after truncation,
    ``randrange(min(10, int(dup_rate · L)))`` tokens (``L`` counts ``[CLS]``/``[SEP]``, which are
    never repeated), positions without replacement; the paper's text differs (words,
    ``[0, max(2, int(dup_rate · len))]``), see ``docs/objectives.md``. Sentences only: with given
    pairs the positive is another sentence.

    Attributes:
        enabled: encode the positive view ``z2`` from the repeated tokens (re-drawn every step).
        dup_rate: the repetition rate, in ``[0, 1)``; the authors' scripts: 0.32 (BERT-base and
            -large), 0.3 (RoBERTa-base), 0.28 (RoBERTa-large). ``0`` repeats nothing (SimCSE).
    """

    enabled: bool = False
    dup_rate: float = 0.32

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.word_repetition``; it is defined for sentences only."""
        check(finite(self.dup_rate) and 0 <= self.dup_rate < 1,
              f"{_P}.word_repetition.dup_rate must be in [0, 1)", self.dup_rate)  # fmt: skip
        if (facts.pairs or facts.hard_negatives) and self.enabled:
            raise ConfigError(
                f"{_P}.word_repetition makes the positive view of one sentence (ESimCSE, Wu et al. "
                "2022, Sec. 3.1: the sentence with some tokens repeated); with given pairs the "
                "positive is another sentence: disable it for pairs data"
            )


#: ``objective.momentum_queue.init``: the momentum encoder's starting weights.
MOMENTUM_INITS = ("pretrained", "random")


@dataclass
class MomentumQueueConfig:
    """ESimCSE's momentum contrast (Wu et al. 2022, Sec. 3.2): a queue of the last
    ``queue_size`` sentences encoded by a momentum encoder, each an extra negative of every anchor.

    The momentum encoder is a copy of the backbone updated after every optimiser step as
    ``θ_m ← momentum · θ_m + (1 - momentum) · θ``; it encodes each batch's sentences with dropout
    off and no gradient (through the live pooler, as the authors' code does), and after the
    step's loss the global batch's rows enter the queue, the oldest leaving. The queue and the
    momentum weights are saved in the checkpoint.

    Attributes:
        enabled: add the queued negatives.
        queue_size: how many earlier sentences the queue keeps (the authors' ``neg_size``:
            160 at batch 64 for BERT-base/-large and RoBERTa-base, 128 for RoBERTa-large);
            ``0`` keeps none (SimCSE).
        momentum: the EMA coefficient, in ``[0, 1]`` (the authors' scripts: 0.995).
        init: the momentum encoder's starting weights: ``pretrained`` (a copy of the backbone
            as training starts) or ``random`` (the architecture's own random initialisation,
            drawn from ``train.seed``: what the authors' code does, since its copy is made
            before the checkpoint loads).
    """

    enabled: bool = False
    queue_size: int = 160
    momentum: float = 0.995
    init: str = "pretrained"

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.momentum_queue``."""
        q = self
        check(q.queue_size >= 0, f"{_P}.momentum_queue.queue_size must be >= 0", q.queue_size)
        check(finite(q.momentum) and 0 <= q.momentum <= 1,
              f"{_P}.momentum_queue.momentum must be in [0, 1]", q.momentum)  # fmt: skip
        check(q.init in MOMENTUM_INITS,
              f"{_P}.momentum_queue.init must be one of {', '.join(MOMENTUM_INITS)}", q.init)  # fmt: skip


@dataclass
class MNTPConfig:
    """Masked next-token prediction (LLM2Vec step 2, BehnamGhader et al. 2024), read from
    ``objective.mntp``. It replaces the contrastive loss: the run trains the LM objective only
    (:mod:`cselab.objectives.mntp`).

    Attributes:
        enabled: train with MNTP instead of InfoNCE (the model is loaded with its causal LM
            head; sentences data only).
        mask_ratio: the probability that a (non-special) token is chosen; the authors: 0.2 for
            Llama models, 0.8 for Mistral.
        mask_token: the token that replaces a chosen token (80% of them; 10% get a random token,
            10% stay); ``null``: the tokenizer's mask token, else ``_`` (the authors' "blank").
    """

    enabled: bool = False
    mask_ratio: float = 0.2
    mask_token: str | None = None

    def validate(self, facts: ObjectiveFacts | None = None) -> None:
        """Ranges of the keys; with ``facts``, MNTP is a language-modelling loss on sentences:
        no contrastive part composes with it (LLM2Vec trains MNTP, then SimCSE, as two runs).
        Raises :class:`ConfigError` naming the key."""
        prefix = f"{_P}.mntp"
        check(finite(self.mask_ratio) and 0 < self.mask_ratio <= 1,
              f"{prefix}.mask_ratio must be in (0, 1]", self.mask_ratio)  # fmt: skip
        if self.mask_token is not None and not self.mask_token:
            raise ConfigError(f"{prefix}.mask_token must be a token or null, not empty")
        if facts is None or not self.enabled:
            return
        objective = facts.objective
        on = [n for n in objective.sections() if n != "mntp" and getattr(objective, n).enabled]
        on += ["hard_negative_weight"] if objective.hard_negative_weight != 0 else []
        on += ["symmetric"] if objective.symmetric else []
        if on:
            raise ConfigError(
                f"{_P}.mntp replaces the contrastive loss, so {_P}.{on[0]} has nothing to act on: "
                "disable it (LLM2Vec trains MNTP first, then SimCSE in a second run)"
            )
        if facts.pairs or facts.hard_negatives:
            raise ConfigError(
                f"{_P}.mntp predicts masked tokens of single sentences; the training data are "
                "pairs: train it on a sentence corpus"
            )


@dataclass
class ObjectiveConfig:
    """Which loss to train with.

    The defaults are unsupervised SimCSE (Gao et al. 2021, Eq. 1): InfoNCE over in-batch
    negatives with temperature 0.05. The sub-sections switch on the four papers' objectives.

    Attributes:
        temperature: τ of the InfoNCE family, applied once to every column's energy.
        symmetric: average the loss over both directions (view 2 as anchor too).
        focal, gaussian, off_dropout, dcl, barlow_twins, mixcse, noise: see their classes.
        matryoshka: the loss at several prefix dimensions (:class:`MatryoshkaConfig`); it wraps
            whatever the other keys describe.
        word_repetition, momentum_queue: ESimCSE's two parts (Wu et al. 2022); see their classes.
        hard_negative_weight: supervised SimCSE's log-weight on each anchor's own given hard
            negative(s) (Gao et al. 2021, Sec. 4 and Appendix; their code's
            ``hard_negative_weight``): the column enters the denominator as ``e^w · e^{s/τ}``.
            ``0`` (the paper's setting) is plain InfoNCE; needs pairs data with hard negatives.
        mntp: masked next-token prediction (LLM2Vec's step 2, :class:`MNTPConfig`); it
            replaces the contrastive loss, so every other sub-section must be off.
    """

    temperature: float = 0.05
    symmetric: bool = False
    focal: FocalConfig = field(default_factory=FocalConfig)
    gaussian: GaussianConfig = field(default_factory=GaussianConfig)
    off_dropout: OffDropoutConfig = field(default_factory=OffDropoutConfig)
    dcl: DCLConfig = field(default_factory=DCLConfig)
    barlow_twins: BarlowTwinsConfig = field(default_factory=BarlowTwinsConfig)
    mixcse: MixCSEConfig = field(default_factory=MixCSEConfig)
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    word_repetition: WordRepetitionConfig = field(default_factory=WordRepetitionConfig)
    momentum_queue: MomentumQueueConfig = field(default_factory=MomentumQueueConfig)
    hard_negative_weight: float = 0.0
    matryoshka: MatryoshkaConfig = field(default_factory=MatryoshkaConfig)
    mntp: MNTPConfig = field(default_factory=MNTPConfig)

    def validate(
        self,
        pairs: bool | None = None,
        hard_negatives: bool | None = None,
        width: int | None = None,
    ) -> None:
        """Raise :class:`~cselab.schema.ConfigError` naming the key if a value has the wrong
        kind, is out of range, or a combination is not defined.

        The one home of every objective check: the parts assume a validated config.

        Args:
            pairs: whether the training data are given pairs (``None``: not known yet); the
                run config knows it from ``data.train_file`` and ``data.format``.
            hard_negatives: whether the pairs carry hard negatives (``None``: not known yet,
                i.e. before the file is read). :func:`~cselab.objectives.build_objective` passes
                both from the run's :class:`~cselab.core.datakind.DataKind`.
            width: the encoder's output width (``None``: not known yet), for
                ``matryoshka.dims``.
        """
        p = _P
        # Kinds first, with the YAML loader's own checks (choices, true/false, whole numbers):
        # a config built in Python skips the loader, and a misspelled choice would otherwise
        # build a different objective without a word.
        check_kinds(self, p)
        check(_positive(self.temperature), f"{p}.temperature must be > 0", self.temperature)
        facts = ObjectiveFacts(self, pairs, hard_negatives, width)
        # each section checks its own keys, and the combinations it would break
        for name in self.sections():
            getattr(self, name).validate(facts)

        w = self.hard_negative_weight
        check(finite(w), f"{p}.hard_negative_weight must be finite", w)
        if w != 0 and (pairs is False or hard_negatives is False):
            raise ConfigError(
                f"{p}.hard_negative_weight={w} weights given hard negatives, but the training "
                "data has none (pairs with a negative column: data.columns.negative)"
            )

    @classmethod
    def sections(cls) -> tuple[str, ...]:
        """The sub-sections (one per paper, each with its ``validate``), in the config's order;
        a new paper's section is found here by being a field."""
        return tuple(
            f.name for f in fields(cls) if isinstance(f.type, str) and f.type.endswith("Config")
        )

    @property
    def symmetric_loss(self) -> bool:
        """Whether the built objective averages both directions."""
        return self.symmetric or (self.mixcse.enabled and self.mixcse.directions == "both")


def _positive(x: float) -> bool:
    return finite(x) and x > 0


@dataclass(frozen=True)
class ObjectiveFacts:
    """What a section's checks may know besides its own values.

    Attributes:
        objective: the whole section (a combination of two sub-sections is refused by one).
        pairs: whether the training data are given pairs (``None``: not known yet).
        hard_negatives: whether the pairs carry hard negatives (``None``: not known yet).
        width: the encoder's output width (``None``: not known yet).
    """

    objective: ObjectiveConfig
    pairs: bool | None = None
    hard_negatives: bool | None = None
    width: int | None = None
