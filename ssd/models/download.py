"""`ssd models download REPO`: fetch a supported model folder from the Hugging Face Hub.

Contract:

* ``add_parser(subparsers)`` adds ``download`` to the ``ssd models`` sub-parsers; ``run(args) -> int`` runs it
  (0 on success, 2 on any refusal or hub error, with one clear ``error:`` message on stderr).
  ``python -m ssd.models.download REPO ...`` runs the same command without the ``ssd`` CLI.
* Only what a model folder needs is fetched (``ALLOW_PATTERNS``: config.json, generation_config.json,
  *.safetensors and their index, tokenizer.json, tokenizer_config.json, special_tokens_map.json,
  chat_template.jinja), top-level files only; never .bin/.pt/.pth/.gguf/.onnx/.msgpack/.h5 nor sub-folders
  (e.g. Meta's ``original/``). The folder is ``<models-dir>/<name>`` (``--name`` defaults to the repo's last
  part lowercased, so ``Qwen/Qwen3-0.6B`` lands in ``qwen3-0.6b``).
* The architecture is checked before any weight is requested: config.json alone is fetched (into a temporary
  cache) and parsed with ``ssd.config.ModelConfig.from_dict``; anything the decoder does not implement
  (``architectures`` other than LlamaForCausalLM / Qwen3ForCausalLM, an unsupported activation or rope
  scaling) is refused with exit 2 naming what was found and what is supported.
* Progress is huggingface_hub's own tqdm bars. Resume is huggingface_hub's: partly downloaded files wait in
  ``<folder>/.cache/huggingface/download/*.incomplete`` and a rerun of the same command continues them; files
  already complete and unchanged are not fetched again. That ``.cache`` folder is kept for this reason.
* After the download the folder is checked as far as serving needs without loading weights: config.json parses
  with our config reader, every weight file (the index's, or at least one *.safetensors) exists, and the
  tokenizer loads with ``ssd.tokenizer.Tokenizer``.

Offline rule: the command reaches the hub only when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is unset or
false *when run() starts*. ``ssd``'s main() sets ``HF_HUB_OFFLINE=1`` by default so that serving never touches
the network; that default applies to this command too, so downloading is an explicit opt-in:
``HF_HUB_OFFLINE=0 ssd models download Qwen/Qwen3-0.6B``. When offline, the command fails at once (no request
is made) and says how to allow it. When online, huggingface_hub's own offline flag (read once at import, possibly
under the CLI default) is turned off for the download and restored after it; ``HF_ENDPOINT`` is read at run() time.

Token: ``--token``, default ``$HF_TOKEN`` (else huggingface_hub's stored login, if any). Gated repos without
access, bad tokens, unknown repos or revisions and an unreachable hub each give a message saying which.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from ssd.config import ARCHITECTURES, ModelConfig, ModelConfigError
from ssd.paths import default_models_dir

ALLOW_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                  "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"]
IGNORE_PATTERNS = ["*/*", "*.bin", "*.pt", "*.pth", "*.gguf", "*.onnx", "*.msgpack", "*.h5"]
_TRUE = {"1", "on", "yes", "true"}


class DownloadError(Exception):
    """A refusal or hub failure; its message is what the user sees."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "download", help="download a supported model (Llama-3 family, Qwen3) from the Hugging Face Hub",
        description="Download config, tokenizer and *.safetensors weights of a Hub repo into <models-dir>/<name>. "
                    "The ssd CLI runs offline by default: set HF_HUB_OFFLINE=0 to allow this command to reach "
                    "the hub. Interrupted downloads resume when the same command is rerun.")
    p.add_argument("repo", help="Hub repo id, e.g. Qwen/Qwen3-0.6B or meta-llama/Llama-3.2-1B-Instruct")
    p.add_argument("--revision", default=None, help="branch, tag or commit (default: main)")
    p.add_argument("--models-dir", type=Path, default=None,
                   help="where model folders live (default: $SSD_MODELS_DIR or ~/.cache/ssd/models)")
    p.add_argument("--name", default=None, help="folder name under --models-dir (default: repo name, lowercased)")
    p.add_argument("--token", default=None, help="Hub access token for gated/private repos (default: $HF_TOKEN)")
    return p


def folder_name(repo: str, name: str | None = None) -> str:
    out = name if name is not None else repo.rstrip("/").split("/")[-1].lower()
    if not out or out in (".", "..") or "/" in out or "\\" in out:
        raise DownloadError(f"invalid folder name {out!r} (from --name or the repo id {repo!r})")
    return out


def hub_offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _offline_message(repo: str) -> str:
    return (f"cannot download {repo}: the Hugging Face Hub cannot be reached because offline mode is on "
            f"(HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE')!r}, TRANSFORMERS_OFFLINE="
            f"{os.environ.get('TRANSFORMERS_OFFLINE')!r}; the ssd CLI sets HF_HUB_OFFLINE=1 by default). "
            f"Allow it for this command: HF_HUB_OFFLINE=0 ssd models download {repo}")


def _hub_error(repo: str, revision: str | None, token: str | None, e: Exception) -> DownloadError:
    """Translate huggingface_hub's exceptions into one clear message."""
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        OfflineModeIsEnabled, RemoteEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, OfflineModeIsEnabled):
        return DownloadError(_offline_message(repo))
    if isinstance(e, GatedRepoError):
        how = ("the token given has no access: accept the model's licence on its Hub page with that account"
               if token else "no token given: accept the licence on its Hub page, then pass --token or set HF_TOKEN")
        return DownloadError(f"{repo} is a gated repo ({how})")
    if isinstance(e, RepositoryNotFoundError):
        hint = ("check the id, and that this token may read it" if token
                else "check the id; if it is private or gated, pass --token or set HF_TOKEN")
        return DownloadError(f"repo {repo} not found on {_endpoint()} (HTTP {status}): {hint}")
    if isinstance(e, RevisionNotFoundError):
        return DownloadError(f"revision {revision!r} not found in {repo}")
    if isinstance(e, RemoteEntryNotFoundError):
        return DownloadError(f"{repo} has no config.json: not a transformers model folder")
    if isinstance(e, HfHubHTTPError) and status == 401:
        return DownloadError(f"the hub rejected the token (HTTP 401) for {repo}: check --token / HF_TOKEN")
    if isinstance(e, HfHubHTTPError):
        return DownloadError(f"the hub answered HTTP {status} for {repo}: {str(e).splitlines()[0]}")
    if isinstance(e, (LocalEntryNotFoundError, ConnectionError, OSError)) or any(
            w in type(e).__name__.lower() for w in ("connect", "timeout", "network")):
        return DownloadError(f"cannot download {repo}: the Hugging Face Hub at {_endpoint()} cannot be reached "
                             f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'}); "
                             "check the network / proxy, or HF_ENDPOINT")
    return DownloadError(f"downloading {repo} failed: {type(e).__name__}: {e}")


def check_config(repo: str, cfg: dict) -> ModelConfig:
    """Refuse a config the decoder does not implement, naming what was found and what is supported."""
    try:
        return ModelConfig.from_dict(cfg, source=f"{repo} config.json")
    except ModelConfigError as e:
        archs, mtype = cfg.get("architectures"), cfg.get("model_type")
        supported = ", ".join(f"{a} (model_type {t!r})" for a, t in sorted(ARCHITECTURES.items()))
        raise DownloadError(f"{repo} is not a supported model: architectures {archs!r}, model_type {mtype!r} "
                            f"({e}). Supported: {supported} — the Llama-3 family (incl. SmolLM2) and Qwen3") from None


def check_folder(folder: Path) -> ModelConfig:
    """The downloaded folder is complete as far as config, weight files and tokenizer go (weights not loaded)."""
    from ssd.tokenizer import Tokenizer
    try:
        cfg = ModelConfig.from_folder(folder)
    except ModelConfigError as e:
        raise DownloadError(f"downloaded folder is not usable: {e}") from None
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise DownloadError(f"{index}: not a valid safetensors index ({e})") from None
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise DownloadError(f"{folder}: weight files listed in {index.name} are missing: {missing}")
    elif not any(folder.glob("*.safetensors")):
        raise DownloadError(f"{folder}: no *.safetensors weights (the repo may only ship .bin/.gguf, "
                            "which ssd does not load)")
    try:
        Tokenizer.from_folder(folder)
    except Exception as e:  # FileNotFoundError, JSON or tokenizers errors: all mean the folder cannot serve
        raise DownloadError(f"{folder}: tokenizer does not load ({type(e).__name__}: {e})") from None
    return cfg


def download(repo: str, dest: Path, revision: str | None = None, token: str | None = None,
             log=print) -> ModelConfig:
    if hub_offline():
        raise DownloadError(_offline_message(repo))
    import huggingface_hub
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    endpoint, token = _endpoint(), token or None
    was_offline = huggingface_hub.constants.HF_HUB_OFFLINE
    huggingface_hub.constants.HF_HUB_OFFLINE = False  # decided above; the import may have seen the CLI default
    try:
        # One plain request first: it fails at once when the hub is unreachable (the file calls below retry for
        # ~25 s) and resolves the revision, so config and weights come from the same commit.
        sha = HfApi(endpoint=endpoint, token=token).model_info(repo, revision=revision, timeout=10).sha
        revision = sha or revision
        with tempfile.TemporaryDirectory(prefix="ssd-download-") as tmp:
            path = hf_hub_download(repo, "config.json", revision=revision, cache_dir=tmp, token=token,
                                   endpoint=endpoint, etag_timeout=10)
            try:
                cfg = json.loads(Path(path).read_text())
            except json.JSONDecodeError as e:
                raise DownloadError(f"{repo} config.json is not valid JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise DownloadError(f"{repo} config.json is not a JSON object")
        mc = check_config(repo, cfg)
        log(f"{repo}: {mc.arch}, {mc.num_layers} layers, hidden {mc.hidden_size}; downloading into {dest}")
        dest.mkdir(parents=True, exist_ok=True)
        snapshot_download(repo, revision=revision, local_dir=dest, token=token, endpoint=endpoint,
                          allow_patterns=ALLOW_PATTERNS, ignore_patterns=IGNORE_PATTERNS)
    except DownloadError:
        raise
    except Exception as e:  # huggingface_hub / httpx errors -> one message
        raise _hub_error(repo, revision, token, e) from e
    finally:
        huggingface_hub.constants.HF_HUB_OFFLINE = was_offline
    return check_folder(dest)


def run(args: argparse.Namespace) -> int:
    try:
        name = folder_name(args.repo, args.name)
        dest = Path(args.models_dir or default_models_dir()).expanduser() / name
        token = args.token if args.token is not None else os.environ.get("HF_TOKEN")
        cfg = download(args.repo, dest, revision=args.revision, token=token)
    except DownloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: rerun the same command to resume the download", file=sys.stderr)
        return 130
    print(f"{args.repo} ready at {dest} ({cfg.arch}); serve it with --model {dest}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ssd.models.download")
    add_parser(parser.add_subparsers(dest="models_command", required=True))
    return run(parser.parse_args(["download", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
