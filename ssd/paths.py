"""Where ssd keeps its prepared models.

Contract:
- ``default_models_dir()`` is ``$SSD_MODELS_DIR`` when set (and non-empty),
  else ``~/.cache/ssd/models``. It is only computed, never created.
- ``DEFAULT_TARGET`` / ``DEFAULT_DRAFT`` name the embedded default model pair (the
  draft is the distilled feature-reading draft); ``target_dir(models_dir)`` /
  ``draft_dir(models_dir)`` are their folders inside ``models_dir`` (the default
  models dir when ``None``). ``LAYER_DRAFT`` / ``layer_draft_dir`` name the
  layer-truncated stand-in draft (an ordinary, poor draft kept for tests).
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_TARGET = "smollm2-135m-instruct"
DEFAULT_DRAFT = "smollm2-135m-eagle"
LAYER_DRAFT = "smollm2-135m-draft-l2"


def default_models_dir() -> Path:
    env = os.environ.get("SSD_MODELS_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "ssd" / "models"


def _base(models_dir: str | os.PathLike | None) -> Path:
    return default_models_dir() if models_dir is None else Path(models_dir).expanduser()


def target_dir(models_dir: str | os.PathLike | None = None) -> Path:
    return _base(models_dir) / DEFAULT_TARGET


def draft_dir(models_dir: str | os.PathLike | None = None) -> Path:
    return _base(models_dir) / DEFAULT_DRAFT


def layer_draft_dir(models_dir: str | os.PathLike | None = None) -> Path:
    return _base(models_dir) / LAYER_DRAFT
