"""Build the embedded tiny model offline: a byte-level BPE tokenizer trained here and a 2-layer
Llama with random weights. No model hub is touched; the result is deterministic for a seed.

    python -m continuum_lab.harness.tiny_model --out .models/tiny-llama
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    """A synthetic agent-flavoured corpus: shell commands, code words, prose."""
    rng = random.Random(seed)
    words = (
        "the a of to and in is for on that with as this by be are from or it an at def class return "
        "import self if else elif for while try except raise with yield lambda None True False print "
        "ls cd cat grep find sed awk git diff python pytest pip echo mkdir rm cp mv head tail wc sort "
        "file line error test pass fail patch repo issue function value list dict string number tool "
        "search fetch url page result query answer weather city time date user assistant system"
    ).split()
    punct = [" ", " ", " ", ", ", ". ", "\n", " && ", " | ", "(", ")", ": ", " = ", "_", "/", "-"]
    out = []
    for _ in range(lines):
        n = rng.randint(4, 24)
        out.append("".join(rng.choice(words) + rng.choice(punct) for _ in range(n)))
    return out


def build(
    out: Path, *, seed: int = 0, vocab_size: int = 1024, hidden: int = 64, layers: int = 2, max_positions: int = 32768
) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = max_positions
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    (out / "continuum_tiny_model.json").write_text(json.dumps({"seed": seed, "vocab_size": len(fast)}))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--if-missing", action="store_true", help="do nothing if the model exists")
    args = ap.parse_args(argv)
    if args.if_missing and (args.out / "continuum_tiny_model.json").exists():
        print(f"[tiny-model] {args.out} exists")
        return 0
    build(args.out, seed=args.seed)
    print(f"[tiny-model] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
