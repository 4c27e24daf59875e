"""Hugging Face Hub ids for a job's model and data: ``--model ORG/NAME[@revision]``, ``--data ORG/NAME[:split]``.

[Note: Hub ids]
An id resolves to a local directory through ``huggingface_hub.snapshot_download``: downloaded when the network is
there, read from the local Hugging Face cache when it is not (``HF_HUB_OFFLINE=1``, or no connection). Only the
files a job reads are fetched (configs, safetensors, tokenizer files for a model; JSON Lines, JSON or Parquet
files for a data set) -- never pickled weights. When neither the network nor the cache has the id, the error is
one line naming the id and the cache directory.

A spec is taken as an id only when it is not a path that exists and looks like one (``ORG/NAME``, one slash, no
data-file extension, no local directory named ``ORG``): ``data/train.jsonl`` that is missing stays a missing file,
and ``models/copy`` beside a ``models/`` directory a missing directory, not a Hub look-up.
"""
from __future__ import annotations

import re
from pathlib import Path

_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
#: what a job reads from a model repository
MODEL_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
#: what a job reads from a data set repository (the record files terastack.training.data.record_files reads)
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


def _split_spec(spec: str, sep: str) -> tuple[str, str | None]:
    repo, _, tail = spec.partition(sep)
    return repo, (tail or None)


def is_hub_id(spec: str | None, *, sep: str) -> bool:
    """Whether ``spec`` (``ORG/NAME`` plus an optional ``sep``-introduced revision or split) names a Hub repository
    rather than a local path."""
    if not spec or Path(spec).exists():
        return False
    repo, _ = _split_spec(spec, sep)
    if Path(repo).parent.is_dir():  # models/copy where ./models exists: a mistyped path, not an organisation
        return False
    return bool(_ID.match(repo)) and not repo.lower().endswith(DATA_SUFFIXES + (".txt", ".py"))


def _snapshot(repo: str, revision: str | None, repo_type: str, patterns: list[str], flag: str, spec: str) -> Path:
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:
        raise ValueError(f"{flag} {spec}: a Hugging Face Hub id needs huggingface_hub (pip install -e '.[llm]')") \
            from None
    try:
        return Path(snapshot_download(repo, revision=revision, repo_type=repo_type, allow_patterns=patterns))
    except Exception as exc:  # offline with nothing cached, unknown repository, no connection: one line
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{flag} {spec}: not in the Hugging Face cache {constants.HF_HUB_CACHE} and not "
                         f"downloadable now ({reason})") from None


def model_dir(spec: str) -> Path:
    """The local directory of the model ``ORG/NAME[@revision]``."""
    repo, revision = _split_spec(spec, "@")
    return _snapshot(repo, revision, "model", MODEL_FILES, "--model", spec)


def data_file(spec: str) -> str:
    """The record file of split ``split`` (default ``train``) of the data set ``ORG/NAME[:split]``: the one file of
    the repository whose path names the split (``train.jsonl``, ``data/train-00000-of-00001.parquet``)."""
    repo, split = _split_spec(spec, ":")
    split = split or "train"
    root = _snapshot(repo, None, "dataset", [f"*{s}" for s in DATA_SUFFIXES], "--data", spec)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in DATA_SUFFIXES)
    named = [p for p in files if re.search(rf"(^|[/_.-]){re.escape(split)}([/_.-]|$)", str(p.relative_to(root)))]
    if len(named) != 1:
        found = ", ".join(str(p.relative_to(root)) for p in files) or "no record files"
        what = "no file" if not named else f"{len(named)} files"
        raise ValueError(f"--data {spec}: {what} for split {split!r} in {root} ({found}); terastack reads one "
                         "JSON Lines, JSON or Parquet file per split")
    return str(named[0])
