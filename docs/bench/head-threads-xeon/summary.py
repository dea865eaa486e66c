"""Per arm: ms per draft token (drafting time over draft tokens), verification and wall seconds, summed over runs."""
import json
from pathlib import Path

here = Path(__file__).parent
for f in ("smollm2-busy", "qwen-quiet-one-thread"):
    rows = json.loads((here / f"{f}.json").read_text())
    for m in sorted({r["mode"] for r in rows}):
        rr = [r for r in rows if r["mode"] == m]
        print(f"{f} {m}: {1e3 * sum(r['draft_s'] for r in rr) / sum(r['draft_tokens'] for r in rr):.2f} ms per draft "
              f"token, verification {sum(r['verify_s'] for r in rr):.2f} s, wall {sum(r['wall_s'] for r in rr):.2f} s, "
              f"(PyTorch, target) threads {sorted({(r['torch_threads'], r['target_threads']) for r in rr})}, runs {len(rr)}")
