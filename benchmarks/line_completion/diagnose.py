"""Where the store's gain goes inside a line: the real line teacher-forced after its prompt.

For each completed line, the real text from the prompt's end to the line's end (the newline and
indentation token first) is appended to the prompt; one exact forward gives p_exact at each of its
tokens, one store_distribution call the store's rows there, the augmented backend's gate λ. Each
token is classed as the line's first token (the one that holds the newline), an indentation token
(whitespace only), or the rest, and per class: mean λ, NLL of the real token under exact and under
the mixture, and top-1 of each. This tells whether the perplexity gain sits where greedy
completion can use it.
"""

from __future__ import annotations

import math

import numpy as np
import torch

CLASSES = ("first token", "indentation", "rest of the line")


def token_class(index: int, piece: str) -> str:
    if index == 0:
        return CLASSES[0]
    return CLASSES[1] if piece and not piece.strip() else CLASSES[2]


def continuation(text: str, prompt) -> str:
    """The real text after the prompt up to the end of the line (no trailing newline)."""
    start = len(prompt.prefix)
    lines = text.split("\n")
    end = len("\n".join(lines[:prompt.line + 1]))
    return text[start:end]


@torch.inference_mode()
def teacher_forced(augmented, hf_model, tokenizer, prompt, text: str, prefilled=None) -> list[dict]:
    """Per token of the real line: its class, λ, p_exact, p_mixture of the real token, both top-1s.
    `prefilled`: the exact state prefilled with the prompt (its KV cache is copied, not changed)."""
    cont = [int(t) for t in tokenizer(continuation(text, prompt), add_special_tokens=False)["input_ids"]]
    if not cont:
        return []
    ids = list(prompt.ids) + cont
    if prefilled is None:
        logits = hf_model(torch.tensor([ids])).logits[0, len(prompt.ids) - 1:len(ids) - 1]
    else:
        import copy

        rows = [prefilled.logits[None]]
        if len(cont) > 1:
            cache = copy.deepcopy(prefilled.cache)
            rows.append(hf_model(input_ids=torch.tensor([cont[:-1]]), cache=cache.layers, use_cache=True).logits[0])
        logits = torch.cat([r.float() for r in rows])
    exact = torch.softmax(logits.to(torch.float64), -1)
    steps = augmented.store_steps(ids[:-1], len(cont))
    lams = augmented.weights(steps, exact)
    rows = []
    for j, (token, step, lam) in enumerate(zip(cont, steps, lams)):
        p_exact = exact[j].cpu().numpy()
        store = np.zeros_like(p_exact)
        if step.token_ids:
            store[np.asarray(step.token_ids)] = step.probabilities
        mixed = (1 - lam) * p_exact + lam * store
        rows.append({"class": token_class(j, tokenizer.decode([token])), "weight": float(lam),
                     "nll_exact": -math.log(max(float(p_exact[token]), 1e-300)),
                     "nll_augmented": -math.log(max(float(mixed[token]), 1e-300)),
                     "top1_exact": float(int(np.argmax(p_exact)) == token),
                     "top1_augmented": float(int(np.argmax(mixed)) == token),
                     "store_has_it": float(store[token] > 0)})
    return rows


def summarise(rows: list[dict]) -> dict:
    """Per class and over all tokens: tokens, mean λ, perplexity exact and augmented, top-1 of each."""
    out = {}
    for name in CLASSES + ("all",):
        mine = [r for r in rows if name == "all" or r["class"] == name]
        if not mine:
            continue
        mean = lambda key: float(np.mean([r[key] for r in mine]))  # noqa: E731
        out[name] = {"tokens": len(mine), "mean_weight": mean("weight"),
                     "perplexity_exact": math.exp(mean("nll_exact")),
                     "perplexity_augmented": math.exp(mean("nll_augmented")),
                     "top1_exact": mean("top1_exact"), "top1_augmented": mean("top1_augmented"),
                     "store_has_it": mean("store_has_it")}
    return out
