# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Build the real-SGLang tier's tiny Llama in DIR, from nothing but this file (no download, no model hub).

    <real environment>/bin/python tests/real/build_model.py DIR

DIR gets a `LlamaForCausalLM` config (2 layers, hidden size 64, 4 heads, 2 KV heads), random weights from a fixed
seed (safetensors), and a byte-level BPE tokenizer trained here with `tokenizers` on a corpus this file generates,
with a chat template, so that SGLang, its benchmark client and `transformers.AutoTokenizer` load it offline. The
model says nothing sensible: the tier checks servers, processes and endpoints, not text. Run by
tests/real/bootstrap.sh with the real server's environment (torch, transformers, tokenizers).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

VOCAB_SIZE = 512
# The context window, long enough that the drain test's request in flight (60,000 new tokens) outlasts the drain
# however fast the machine decodes: the test aborts it once the drain is seen waiting for it.
CONTEXT = 65536
SPECIAL_TOKENS = ['<s>', '</s>', '<unk>', '<pad>']
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
WORDS = (
    'the server draft model token decode prefill speculative accept length batch request router worker gpu memory '
    'kernel cache scheduler launcher drain signal health ready metrics throughput latency fleet host relaunch '
    'rollback verify tune sweep benchmark prompt answer explain paragraph one two three four five six seven eight'
).split()


def corpus(lines: int = 4000, seed: int = 0) -> list[str]:
    """Deterministic text: sentences of the words above with digits and punctuation, enough for 512 merges."""
    rng = random.Random(seed)
    text = []
    for i in range(lines):
        sentence = ' '.join(rng.choice(WORDS) for _word in range(rng.randint(4, 14)))
        text.append('%s%s %d.' % (sentence[0].upper(), sentence[1:], i % 97))
    return text


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # pylint: disable=import-error
    from transformers import PreTrainedTokenizerFast  # pylint: disable=import-error

    tokenizer = Tokenizer(models.BPE(unk_token='<unk>'))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token='<s>',
        eos_token='</s>',
        unk_token='<unk>',
        pad_token='<pad>',
        model_max_length=CONTEXT,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def build_model(out: Path, tokenizer) -> None:
    import torch  # pylint: disable=import-error
    from transformers import LlamaConfig, LlamaForCausalLM  # pylint: disable=import-error

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype='float32',
    )
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(str(out), safe_serialization=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True)
    tokenizer = build_tokenizer(out)
    if len(tokenizer) > VOCAB_SIZE:
        raise SystemExit('tokenizer has %d tokens, more than the model vocabulary %d' % (len(tokenizer), VOCAB_SIZE))
    build_model(out, tokenizer)
    print('tiny Llama in %s: %d tokens' % (out, len(tokenizer)))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
