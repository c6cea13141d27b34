"""vs-textbrewer's distilkit side with one config change (investigation only)."""
import json, sys, argparse
from pathlib import Path
sys.path.insert(0, "/work/wt/lab/benchmarks")
import vs_textbrewer as vt
from distilkit.config import build_config
from distilkit.run import run_experiment

seed, tag = int(sys.argv[1]), sys.argv[2]
changes = json.loads(sys.argv[3])
args = argparse.Namespace(data="/work/shared/data", teacher="/work/wt/lab/benchmarks/work/teachers/sst2-4k/best",
                          examples=4000, epochs=3, lr=5e-4, threads=1, seed=seed)
work = Path(f"/work/study/vstb/{tag}-seed{seed}")
cfg = vt.distilkit_config(args, work, "no")
for section, fields in changes.items():
    cfg[section].update(fields)
m = run_experiment(build_config(cfg))
print(json.dumps({"tag": tag, "seed": seed, "final": m["final"]["dev"]["accuracy"]}))
(work / "summary.json").write_text(json.dumps({"tag": tag, "seed": seed, "final": m["final"]["dev"]["accuracy"], "changes": changes}))
