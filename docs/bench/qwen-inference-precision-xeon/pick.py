"""Run train-drafter's inference-precision choice on an already trained head (a copy of its folder, since the
choice rewrites drafter.json): fp32 and int8 evaluated on the 38 development prompts (greedy, k = 4, fixed
policy, 64 new tokens each), the faster by pick_inference_precision recommended.

usage: python pick.py TRAINED_DRAFTER_DIR OUT.json
"""
import json
import shutil
import sys
import tempfile
from pathlib import Path

from speculative.drafters.head_nets import CONFIG_FILE, HeadConfig
from speculative.training.train import TrainConfig, recommend_inference_precision

src, out = Path(sys.argv[1]), Path(sys.argv[2])
with tempfile.TemporaryDirectory() as tmp:
    d = Path(tmp) / "drafter"
    shutil.copytree(src, d)
    hcfg = HeadConfig.from_json((d / CONFIG_FILE).read_text())
    choice, heldout, record = recommend_inference_precision("qwen2.5-coder-1.5b-instruct", d, hcfg,
                                                            TrainConfig(method="eagle"))
    record["recommended_in_drafter_json"] = json.loads((d / CONFIG_FILE).read_text())["extra"]
out.write_text(json.dumps({"drafter": str(src), **record}, indent=1))
print(json.dumps({k: v for k, v in record.items()}, indent=1))
