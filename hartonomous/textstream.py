"""Token ids -> text pieces for streaming: never split a multi-byte character, honour stop strings.

Byte-level BPE tokens can end in the middle of a UTF-8 character; decoding such a prefix gives
U+FFFD. Like vLLM's incremental detokenizer, we decode a short window
`ids[prefix_offset:]` and emit only the new suffix once it no longer ends in U+FFFD, so the
cost per token is constant and the pieces join to `decode(all ids)`.

Stop strings are matched on the decoded text. Text that could still turn into a stop string
is held back, so nothing that ends up cut off is ever emitted.
"""

from __future__ import annotations

from collections.abc import Sequence

REPLACEMENT = "\ufffd"


def decode(tokenizer, ids: Sequence[int]) -> str:
    """The one decode call used for generated text (no space clean-up, which is not prefix-stable)."""
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def cut_at_stop(text: str, stop_strings: Sequence[str]) -> tuple[str, bool]:
    """`text` up to the earliest stop string, and whether one was found."""
    hits = [i for i in (text.find(s) for s in stop_strings if s) if i >= 0]
    return (text[:min(hits)], True) if hits else (text, False)


def _held_back(text: str, stop_strings: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    longest = 0
    for stop in stop_strings:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


class TextStream:
    """Feed generated token ids one at a time; get back the text that is safe to show."""

    def __init__(self, tokenizer, stop_strings: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stop_strings = [s for s in stop_strings if s]
        self.ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""          # decoded, complete characters (cut at a stop string if one was hit)
        self._sent = 0          # characters of `text` already returned
        self.stopped = False    # a stop string was found

    def push(self, token_id: int) -> str:
        """Add one token; return the new piece of text (often '', never half a character)."""
        if self.stopped:
            return ""
        self.ids.append(int(token_id))
        prefix = decode(self.tokenizer, self.ids[self._prefix_offset:self._read_offset])
        current = decode(self.tokenizer, self.ids[self._prefix_offset:])
        if len(current) > len(prefix) and not current.endswith(REPLACEMENT):
            self._append(current[len(prefix):])
            self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        return self._release()

    def finish(self) -> str:
        """No more tokens: return everything not yet shown (an unfinished character becomes U+FFFD)."""
        if not self.stopped and self._read_offset < len(self.ids):
            prefix = decode(self.tokenizer, self.ids[self._prefix_offset:self._read_offset])
            current = decode(self.tokenizer, self.ids[self._prefix_offset:])
            self._append(current[len(prefix):])
            self._read_offset = len(self.ids)
        piece, self._sent = self.text[self._sent:], len(self.text)
        return piece

    def _append(self, piece: str) -> None:
        # a stop string can only start in the last len(stop) - 1 characters already seen
        start = max(0, len(self.text) - max((len(s) for s in self.stop_strings), default=1) + 1)
        self.text += piece
        head, tail = self.text[:start], self.text[start:]
        tail, self.stopped = cut_at_stop(tail, self.stop_strings)
        self.text = head + tail

    def _release(self) -> str:
        end = len(self.text) if self.stopped else len(self.text) - _held_back(self.text, self.stop_strings)
        if end <= self._sent:
            return ""
        piece, self._sent = self.text[self._sent:end], end
        return piece
