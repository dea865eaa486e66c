"""Train the Qwen head's recipe (docs/training.md) on an existing data folder with a chosen unrolled context.

usage: python train.py OUT_DIR DATA_RUN_DIR own|target
(the recipe of runs/qwen-eagle-a4 in docs/bench/qwen-eagle-text-xeon: 4 epochs, batch 8, lr 5e-4, 16,384-token
draft vocabulary, 600 + 300 prompts of 128 tokens; the data is reused with data_from, not generated)
"""
import json
import sys
from pathlib import Path

from speculative.training.data import DataConfig
from speculative.training.train import TrainConfig, train_drafter

out, data_from, context = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
cfg = TrainConfig(method="eagle", epochs=4, lr=5e-4, batch_size=8, draft_vocab=16384, data_from=data_from,
                  target="qwen2.5-coder-1.5b-instruct", unroll_context=context,
                  data=DataConfig(prompts_a=600, prompts_b=300, max_new_tokens=128, prompt_set=2, parallel=16))
m = train_drafter("qwen2.5-coder-1.5b-instruct", out, cfg)
print(json.dumps({"heldout_tau": m["heldout"]["mean_accepted_tokens"],
                  "per_position": m["heldout"]["per_position_acceptance"],
                  "inference_precision": m["inference_precision"]}, indent=1))
