"""Where a classifier gathers the sentence into [CLS]: per layer, how much [CLS] attends to itself (mean over heads and
sentences) and how far its vector moves from sentence to sentence (mean distance to the mean [CLS]). A [CLS] that
attends to itself and is the same for every sentence carries nothing yet for the head to read. Asks why a student cut
from a teacher's first layers fails with TinyBERT (demo-study2, README: "The first-layers cut on the demo's budget").

    DISTILKIT_DATA=../shared/data python benchmarks/cls_gathering.py MODEL_FOLDER [MODEL_FOLDER ...]

Each MODEL_FOLDER is an SST-2 model in Hugging Face form (a cell's best/ or final/); it reads the first 256 sentences
of SST-2 dev, in fp32 with eager attention (SDPA returns no attention weights).
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from distilkit.config import DataConfig, task_config
from distilkit.data.readers import read_split
from distilkit.data.tasks import task_spec


@torch.inference_mode()
def cls_per_layer(folder: str, sentences: list[str]) -> list[tuple[float, float | None]]:
    """Per hidden state (the embeddings, then each layer): ([CLS] spread, [CLS]'s attention to itself)."""
    model = AutoModelForSequenceClassification.from_pretrained(folder, attn_implementation="eager").eval()
    enc = AutoTokenizer.from_pretrained(folder)(sentences, padding=True, truncation=True, max_length=128,
                                                return_tensors="pt")
    out = model(**enc, output_hidden_states=True, output_attentions=True)
    rows = []
    for i, hidden in enumerate(out.hidden_states):
        cls = hidden[:, 0].float()
        spread = (cls - cls.mean(0)).norm(dim=-1).mean().item()
        rows.append((spread, out.attentions[i - 1][:, :, 0, 0].mean().item() if i else None))
    return rows


def main(folders: list[str]) -> None:
    dev = read_split(task_spec(task_config({"name": "sst2"})), "dev", DataConfig())  # from $DISTILKIT_DATA, as a run
    sentences = [example.texts[0] for example in dev[:256]]
    for folder in folders:
        if not (Path(folder) / "config.json").is_file():
            sys.exit(f"{folder} is not a model folder (no config.json): give a cell's best/ or final/")
        print(f"\n{folder}\n| layer | [CLS] spread | [CLS] to itself |\n|---|---|---|")
        for i, (spread, self_attention) in enumerate(cls_per_layer(folder, sentences)):
            print(f"| {i or 'embeddings'} | {spread:.3f} | {'' if self_attention is None else f'{self_attention:.3f}'} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
