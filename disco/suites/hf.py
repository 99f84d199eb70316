"""Hugging Face hub datasets as suites: ``hf:DATASET[:CONFIG]:SPLIT`` read with the ``datasets`` library.

DATASET is a hub id (``tatsu-lab/alpaca``, ``abisee/cnn_dailymail``) or a local folder: one written by
``Dataset.save_to_disk`` is read with ``load_from_disk``, any other with ``load_dataset`` (a folder of JSON / CSV /
Parquet files). SPLIT takes the library's slicing (``test[:200]``). Rows become prompts as in ``disco.suites.rows``
(a question file or HumanEval's format is recognised by its columns). Where the hub cannot be reached (or offline
mode is on) the library is run in offline mode, so a dataset already in its cache still loads and any other fails
in a second with one line saying what to do.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from disco import hub
from disco.errors import BenchError
from disco.suites.formats import table_suite
from disco.suites.record import Suite, SuiteOptions

PREFIX = "hf:"
log = logging.getLogger(__name__)


def parse(spec: str) -> tuple[str, str | None, str]:
    """(dataset, config or None, split) of ``hf:DATASET[:CONFIG]:SPLIT``."""
    parts = spec[len(PREFIX):].split(":")
    if len(parts) not in (2, 3) or not all(p.strip() for p in parts):
        raise BenchError(f"{spec!r}: write hf:DATASET:SPLIT or hf:DATASET:CONFIG:SPLIT (e.g. hf:tatsu-lab/alpaca:train, "
                         "hf:abisee/cnn_dailymail:3.0.0:test)")
    parts = [p.strip() for p in parts]
    return parts[0], (parts[1] if len(parts) == 3 else None), parts[-1]


@contextlib.contextmanager
def _offline(on: bool):
    """The datasets library in offline mode for one call (it reads the flag per call; set before its import only
    by the environment)."""
    if not on:
        yield
        return
    import datasets
    import huggingface_hub.constants as hub_constants

    saved = datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


def _load(name: str, config: str | None, split: str):
    try:
        import datasets
    except ImportError:
        raise BenchError("hf: suites need the datasets library: pip install -r requirements.txt") from None
    folder = Path(name).expanduser()
    if folder.is_dir() and ((folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file()):
        data = datasets.load_from_disk(str(folder))
        if isinstance(data, datasets.DatasetDict):
            if split not in data:
                raise BenchError(f"{name}: no split {split!r} (splits: {', '.join(data)})")
            data = data[split]
        return data
    local = folder.is_dir()
    with _offline(not local and not hub.reachable()):
        return datasets.load_dataset(str(folder) if local else name, config, split=split)


def hf_suite(spec: str, options: SuiteOptions) -> Suite:
    name, config, split = parse(spec)
    try:
        data = _load(name, config, split)
    except BenchError:
        raise
    except Exception as exc:  # noqa: BLE001 - the library raises many kinds; each becomes one line saying what to do
        log.warning("loading %s failed", spec, exc_info=True)
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        offline = not Path(name).expanduser().is_dir() and not hub.reachable()
        what = ("the Hugging Face hub cannot be reached from here and the dataset is not in the datasets cache: run "
                "once where the hub is reachable (the cache keeps it), or save it as JSONL and pass the file"
                if offline else "check the dataset id, config and split on the hub")
        raise BenchError(f"cannot load {spec}: {text[:200]} ({what})") from None
    columns = list(getattr(data, "column_names", None) or [])
    short = name.rstrip("/").split("/")[-1] or "hf"
    label = f"{spec} ({len(data):,} rows)"
    return table_suite(iter(data), columns, options, label, short, id_prefix=f"{short}-")
