"""The figures behind glue-methods/README.md's "LRC on STS-B" section that no bench record holds: each LRC
STS-B run's dev score at every evaluation (from its log), the spread of STS-B train labels, and the size of
the teacher's embedding outputs, which ε = 1 is measured against.

Usage: DISTILKIT_DATA=../shared/data python benchmarks/lrc_stsb_evidence.py   (writes the JSON beside the README)
"""

import json
import statistics
from pathlib import Path

import torch

from distilkit.run import model_split

ROOT = Path(__file__).resolve().parent
RUNS = ROOT / "work/bench/glue-methods/runs"
OUT = ROOT / "results/glue-methods/lrc_stsb_evidence.json"
TEACHER = ROOT / "work/teachers/stsb/best"


def dev_history(run: Path) -> dict[int, float]:
    entries = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    return {e["step"]: e["eval"]["dev"]["pearson"] for e in entries if "eval" in e}


def embedding_norms() -> dict[str, float]:
    """Per-token and per-sentence (l × d) norms of the teacher's embedding output on STS-B dev."""
    from transformers import AutoModel

    _, dev = model_split("stsb", TEACHER)
    model = AutoModel.from_pretrained(str(TEACHER)).eval()
    tokens, sentences = [], []
    with torch.no_grad():
        for start in range(0, len(dev), 64):
            batch = dev.collate([dev[i] for i in range(start, min(start + 64, len(dev)))])
            embedded = model.embeddings(input_ids=batch["input_ids"], token_type_ids=batch.get("token_type_ids"))
            mask = batch["attention_mask"].bool()
            tokens += embedded.norm(dim=-1)[mask].tolist()
            sentences += (embedded * mask.unsqueeze(-1)).flatten(1).norm(dim=1).tolist()
    return {"per_token_median": statistics.median(tokens), "per_sequence_median": statistics.median(sentences),
            "per_sequence_p10": statistics.quantiles(sentences, n=10)[0],
            "per_sequence_p90": statistics.quantiles(sentences, n=10)[-1]}


def main() -> None:
    runs = sorted(RUNS.glob("stsb-lrc*"))
    if not runs or not (TEACHER / "config.json").is_file():
        raise SystemExit(f"needs the STS-B teacher ({TEACHER}) and the stsb-lrc* cells under {RUNS}: run "
                         "`distilkit bench glue-methods --cell stsb-lrc-S3-384 ...` first")
    _, train = model_split("stsb", TEACHER, split="train")
    result = {"dev_pearson_by_step": {run.name: dev_history(run) for run in runs},
              "train_label_variance": statistics.pvariance(float(label) for label in train.labels),
              "teacher_embedding_norms": embedding_norms()}
    OUT.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
