import json, sys
from pathlib import Path
from speculative.training.train import evaluate_drafter
r = evaluate_drafter("qwen2.5-coder-1.5b-instruct", Path(sys.argv[1]), "eagle")
json.dump(r, open(sys.argv[2], "w"), indent=1)
print(r["mean_accepted_tokens"], r["per_position_acceptance"])
