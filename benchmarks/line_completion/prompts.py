"""The prompt for completing one line, where it ends, and the token budgets.

Where the prompt ends. SmolLM2's byte-level BPE merges a newline with the next line's indentation
("\\n" + "    " is one token), so a prompt that ends in a newline forces a token boundary the model
rarely saw in training and then asks it for a bare indentation token. The prompt therefore ends at
the end of the last non-blank text before the line (trailing whitespace and newlines cut), and the
model writes the newline, any blank lines and the indentation itself. The completed line is the
first non-blank line the model writes after that first newline (`completed_line`); generation
stops as soon as it has finished one (`line_done`).

Budgets. The in-file prompt is cut from the left to `in_file` tokens; retrieved text (when a
system uses it) takes at most `retrieval` more; both together with the NEW_TOKENS generated ones
must fit the model's context.
"""

from __future__ import annotations

from dataclasses import dataclass

from hartonomous.errors import UserError

NEW_TOKENS = 64              # every system writes at most this many tokens per line


@dataclass(frozen=True)
class Budgets:
    """Tokens of the file before the line (`in_file`) and of retrieved chunks (`retrieval`)."""

    in_file: int
    retrieval: int

    def check(self, context: int, new_tokens: int = NEW_TOKENS) -> None:
        """Refuse budgets that cannot be met: each must be positive (retrieval may be 0), and
        together with the generated tokens they must fit the model's context."""
        if self.in_file < 1:
            raise UserError(f"--in-file-tokens must be at least 1, got {self.in_file}")
        if self.retrieval < 0:
            raise UserError(f"--retrieval-tokens must be at least 0, got {self.retrieval}")
        total = self.in_file + self.retrieval
        if total > context - new_tokens:
            raise UserError(f"the budgets take {total} tokens (--in-file-tokens {self.in_file} + "
                            f"--retrieval-tokens {self.retrieval}) but the model's context of {context} tokens "
                            f"leaves {context - new_tokens} after the {new_tokens} generated ones")


@dataclass(frozen=True)
class LinePrompt:
    """One line to complete: the text before it (cut as above) and the line itself."""

    path: str                 # the file, relative to its repository
    line: int                 # 0-based line number
    target: str               # the line, trailing whitespace stripped
    prefix: str               # the file up to the line, ending at the last non-blank text before it
    ids: list[int]            # the prefix's last `in_file` tokens


def prefix_before(text: str, line: int) -> str:
    """The file before 0-based `line`, ending at the last non-whitespace character before it."""
    return "\n".join(text.split("\n")[:line]).rstrip()


def line_prompt(tokenizer, path: str, text: str, line: int, in_file: int) -> LinePrompt:
    """The prompt for `line` of `text`, its tokens cut from the left to `in_file`."""
    prefix = prefix_before(text, line)
    ids = [int(t) for t in tokenizer(prefix, add_special_tokens=False)["input_ids"]]
    return LinePrompt(path, line, text.split("\n")[line].rstrip(), prefix, ids[-in_file:])


def completed_line(generated: str) -> str:
    """The line a completion wrote: the first non-blank line after its first newline (what came
    before that newline still belongs to the prompt's last line), trailing whitespace stripped;
    "" when there is none."""
    pieces = generated.split("\n")[1:]
    return next((p.rstrip() for p in pieces if p.strip()), "")


def line_done(generated: str) -> bool:
    """Whether a completion has written a whole non-blank line after its first newline."""
    pieces = generated.split("\n")
    return any(p.strip() for p in pieces[1:-1])
