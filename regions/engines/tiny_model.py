"""A tiny random-weight Llama that real vLLM can serve on a CPU, made locally (nothing is downloaded).

vLLM's ``--load-format dummy`` fills the weights randomly, so the model directory needs only
``config.json``, ``tokenizer.json`` and ``tokenizer_config.json``. The tokenizer
is a byte-level BPE whose vocabulary has exactly the model's ``vocab_size`` entries, so every token the
random model samples decodes to text.
"""

import json
from pathlib import Path

VOCAB_SIZE = 337
SPECIALS = ["<unk>", "<s>", "</s>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}</s>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-05,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
}


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode table: 256 printable characters, one per byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    extra = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + n) for n in range(len(extra))]


def tokenizer_json() -> dict[str, object]:
    vocab = {token: index for index, token in enumerate(SPECIALS)}
    for char in _byte_alphabet():
        vocab[char] = len(vocab)
    filler = 0
    while len(vocab) < VOCAB_SIZE:
        vocab[f"<extra_{filler}>"] = len(vocab)
        filler += 1
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, t in enumerate(SPECIALS)
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def write_tiny_model(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(CONFIG, indent=2))
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 2048,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    return directory
