"""Forward-pass throughput of the build's teacher forcing (projection.distill) on SmolLM2.

    .venv/bin/python benchmarks/distill.py --tokens 8192 --context-length 512 --batch-tokens 4096

Runs `distill` (batched forward pass + sliced LM head + argmax) over real corpus text and
prints tokens/s; model loading is timed separately.
"""

from __future__ import annotations

import argparse
import time

import torch

from hartonomous.model import load_model, load_tokenizer
from hartonomous.corpus.sources import load_corpus
from projection.distill import chunk_ids, distill, tokenize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--context-length", type=int, default=512)
    parser.add_argument("--batch-tokens", type=int, nargs="+", default=[4096])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    start = time.perf_counter()
    model, tokenizer = load_model(args.model, args.device), load_tokenizer(args.model)
    print(f"model loaded in {time.perf_counter() - start:.1f}s; torch threads: {torch.get_num_threads()}")
    corpus = load_corpus(None, args.tokens)
    chunks = chunk_ids(tokenize(tokenizer, corpus.train_text, args.tokens)[0], args.context_length)
    distill(model, chunks[:1], args.batch_tokens[0])  # warm-up
    for batch in args.batch_tokens:
        result = distill(model, chunks, batch)
        print(f"context {args.context_length}, batch {batch} tokens: {result.tokens} tokens in "
              f"{result.seconds:.1f}s = {result.tokens_per_second:,.0f} tokens/s ({args.device})")


if __name__ == "__main__":
    main()
