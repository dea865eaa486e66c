"""The settings of a ``speculative train-drafter`` run (recorded in its run folder's ``train_config.json``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .data import DataConfig


@dataclass
class TrainConfig:
    method: str = "eagle"
    epochs: int = 6
    lr: float | None = None  # peak learning rate; None: 2e-3 for heads, 5e-4 for draft models
    batch_size: int = 16
    draft_vocab: int = 8192
    reg_weight: float = 0.5
    noise: float = 0.1
    unroll: bool = True
    # what the unrolled steps attend to: "own" (every position's input is the head's own prediction, the
    # shipped heads' recipe) or "target" (EAGLE-3's training-time test: the target-fed context plus the
    # chain of the head's own earlier steps, as the drafting cache holds them; EagleHead.forward_unrolled)
    unroll_context: str = "own"
    medusa_heads: int = 3
    seed: int = 0
    threads: int | None = None
    eval_prompts: int | None = None  # development prompts for the held-out estimate (None: all)
    data_from: str | None = None  # reuse the data folder of another run (same target)
    target: str = ""  # the target as given on the command line (recorded so a resume checks it)
    extra_data: list[str] = field(default_factory=list)  # more run folders whose data/ to add
    dropout: float = 0.1
    weight_decay: float = 0.05
    device: str | None = None  # torch device of training (None: cpu)
    data_backend: str = "llama.cpp"  # backend that generates the data ("llama.cpp" or "transformers")
    train_tokens: int | None = None  # train on a seeded subset of about this many tokens (a learning-curve point)
    precision: str = "auto"  # "fp32", "bf16" (autocast) or "auto": bf16 where the hardware has it (AVX512-BF16, AMX, CUDA)
    # the precision the head's drafter.json recommends for inference ("int8", "fp32", or "auto": measured, see
    # pick_inference_precision); EAGLE heads only (Medusa heads run fp32)
    inference_precision: str = "auto"
    # the draft vocabulary the head's drafter.json recommends for inference (EAGLE heads): "auto" (measured: the
    # whole vocabulary and half and a quarter of draft_vocab, each at least MIN_AUTO_DRAFT_VOCAB; see
    # recommend.pick_draft_vocab), "all", or a number of the most frequent tokens ("8192" or 8192)
    inference_vocab: str | int = "auto"
    data: DataConfig = field(default_factory=DataConfig)
