"""The ``--output`` directory of a fine-tuning job: nothing there looks finished until the job has finished.

While the job trains, its metrics go to ``DIR.partial/`` beside the output. At the end the model is exported
into a temporary directory, the tokenizer, ``metrics.jsonl`` (and ``tensorboard/``) and ``finetune.yaml`` join
it, and it is renamed to ``DIR`` in one step (:func:`terastack.atomic.replace_dir`). A job that fails or is
interrupted leaves ``DIR`` as it was (absent, or an earlier export) and its metrics in ``DIR.partial/``.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from terastack.atomic import fsync_dir, replace_dir

#: files that mark a directory as a model export, which a new export may replace
EXPORT_MARKERS = ("config.json", "adapter_config.json", "finetune.yaml")


def check_replaceable(path: str | os.PathLike, *, flag: str = "--output") -> None:
    """Refuse to replace ``path`` unless it is absent, empty or an earlier model export (one of
    :data:`EXPORT_MARKERS` in it): every command that writes an output directory replaces it whole, and a user's
    directory of other files must never be the casualty of a mistyped flag. ``flag`` names the setting."""
    path = Path(path)
    if not path.exists():
        return
    if not path.is_dir():
        raise ValueError(f"{flag} {path}: exists and is not a directory")
    if any(path.iterdir()) and not any((path / m).exists() for m in EXPORT_MARKERS):
        raise ValueError(f"{flag} {path}: a non-empty directory that is not a model export; "
                         "refusing to replace it (give a new or empty directory)")


class OutputDir:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        check_replaceable(self.path)
        self.partial = self.path.with_name(self.path.name + ".partial")

    @property
    def metrics_path(self) -> Path:
        return self.partial / "metrics.jsonl"

    def start(self, *, resuming: bool) -> None:
        """A fresh ``DIR.partial/`` (a resumed job keeps the earlier attempt's metrics there)."""
        if not resuming:
            shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir(parents=True, exist_ok=True)

    def finish(self, trainer, tokenizer, *, max_shard_size, write_job) -> Path:
        """Export ``trainer``'s model with ``tokenizer`` (None: the model's own files, if any), move the
        metrics in, ``write_job(path)`` the job file, and rename the whole to the output directory."""
        staging = self.path.with_name(f".{self.path.name}.export-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            trainer.save_pretrained(staging, max_shard_size=max_shard_size)
            if tokenizer is not None:  # the export loads with transformers on its own, tokenizer too
                tokenizer.save_pretrained(str(staging))
            for entry in self.partial.iterdir() if self.partial.exists() else ():
                copy = shutil.copytree if entry.is_dir() else shutil.copy2
                copy(entry, staging / entry.name)  # copies: a failure here still leaves DIR.partial whole
            write_job(staging / "finetune.yaml")
            fsync_dir(staging)
            replace_dir(staging, self.path)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        shutil.rmtree(self.partial, ignore_errors=True)
        return self.path
