"""Build a tiny Llama with random weights and a locally trained tokenizer, for vLLM.

Nothing can be downloaded from a model hub on this project's machines, so the model
the real-engine tests serve is made here, deterministically, from nothing:

* text: sentences drawn (seeded) from a small built-in word list;
* tokenizer: a byte-level BPE trained on that text with the ``tokenizers`` library
  (any input text encodes: the 256 byte symbols are in the base alphabet), saved as
  ``tokenizer.json`` + ``tokenizer_config.json`` (bos ``<s>``, eos ``</s>``, a chat
  template) through ``transformers.PreTrainedTokenizerFast``;
* model: ``LlamaForCausalLM`` (hidden 1024, 4 layers, 16 heads of 64, vocab = the
  tokenizer's, 2048 positions; 44 M parameters, 176 MB), random weights from
  ``torch.manual_seed``, saved with ``save_pretrained`` as safetensors in float32.

Its output is gibberish, which does not matter: the tests measure latency, not text.

Why not smaller: with hidden 128 a decode step takes ~1.5 ms on one core, and vLLM's
API server (one Python process that detokenizes and streams every token) cannot keep
up with ~600 steps/s on a 2-core machine: streams arrive in bursts, new requests are
admitted late and clients see TTFTs seconds longer than the engine records. At this
size a step takes ~17 ms, a GPU-like inter-token latency, and the frontend keeps up.

Run it with the vLLM virtualenv's python (it needs torch, transformers, tokenizers)::

    ~/.cache/llm-latency/vllm-venv/bin/python tests/real_engine/tiny_model.py OUT_DIR

Prints one JSON line describing what it built. The model is built in a sibling
directory and renamed into place when complete; a directory that already holds a model
of the same recipe (its ``tiny_model.json`` says so) is reused unless ``--force``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

#: Bumped when what this script builds changes, so cached models are rebuilt.
RECIPE_VERSION = 1
SEED = 1234

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3 in this order
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_WORDS = (
    "the a an one two three some many every each this that these those model server token request queue "
    "latency batch prefill decode engine cache block memory scheduler metric histogram bucket sample scrape "
    "window quantile median tail fast slow busy idle waiting running finished stream prompt answer question "
    "user assistant system time second millisecond first last next previous early late long short small large "
    "tiny huge red green blue river mountain city house garden tree flower bird cat dog horse fish bread water "
    "coffee tea book letter word sentence story song music light night morning evening summer winter spring "
    "autumn walks runs reads writes sees finds keeps gives takes makes sends waits stops starts grows falls "
    "opens closes and or but because when while after before under over near far inside outside with without "
    "is are was were has have had will would can could should may might not very quite rather almost never "
    "always often sometimes today tomorrow yesterday here there where why how what who which"
).split()


def corpus(seed: int, sentences: int = 6000) -> list[str]:
    """Seeded pseudo-English, plus digits and punctuation so they get merges too."""
    rng = random.Random(seed)
    lines = []
    for i in range(sentences):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 18))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 10_000)))
        sentence = " ".join(words)
        sentence = sentence[0].upper() + sentence[1:] + rng.choice((".", ".", ".", "?", "!", ",", ";"))
        lines.append(sentence if i % 7 else f"<|user|>\n{sentence}\n<|assistant|>\n")
    return lines


def build_tokenizer(out: Path, vocab_size: int, seed: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    bos = tok.token_to_id("<s>")
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        model_max_length=2048, clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, vocab_size: int, seed: int, hidden: int, layers: int, heads: int) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
        bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory to build the model in")
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--force", action="store_true", help="rebuild even if a complete model is there")
    args = parser.parse_args(argv)

    out: Path = args.out
    stamp = out / "tiny_model.json"
    recipe = {"recipe": RECIPE_VERSION, "vocab_size": args.vocab_size, "hidden": args.hidden,
              "layers": args.layers, "heads": args.heads, "seed": args.seed}
    if not args.force and stamp.is_file():
        try:
            built = json.loads(stamp.read_text())
        except ValueError:
            built = {}
        if {k: built.get(k) for k in recipe} == recipe:
            print(json.dumps({**built, "reused": True}))
            return 0

    started = time.perf_counter()
    # Built beside ``out`` and renamed into place, so a reader (or a second build running
    # at the same time) never sees a half-written model.
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}.build-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        tokenizer = build_tokenizer(work, args.vocab_size, args.seed)
        vocab = len(tokenizer)
        params = build_model(work, vocab, args.seed, args.hidden, args.layers, args.heads)
        check(work)
        info = {**recipe, "vocab": vocab, "parameters": params, "dir": str(out),
                "seconds": round(time.perf_counter() - started, 2), "reused": False}
        (work / stamp.name).write_text(json.dumps(info, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out, ignore_errors=True)  # an older recipe
        try:
            os.rename(work, out)
        except OSError:
            if not stamp.is_file():  # not a concurrent build of ours that got there first
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(info))
    return 0


def check(path: Path) -> None:
    """Round trip: what vLLM will load must load, and encode/decode sensibly."""
    from transformers import AutoConfig, AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(path)
    sample = "The server waits for the scheduler, 42 tokens later!"
    ids = loaded(sample)["input_ids"]
    assert ids[0] == loaded.bos_token_id == 1, ids[:3]
    assert loaded.decode(ids, skip_special_tokens=True) == sample, loaded.decode(ids)
    assert loaded.eos_token_id == 2
    chat = loaded.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                      add_generation_prompt=True)
    assert chat.endswith("<|assistant|>\n"), chat
    assert AutoConfig.from_pretrained(path).model_type == "llama"


if __name__ == "__main__":
    sys.exit(main())
