"""The text atoms are built from and scored on, and the labels written for it.

`sources` reads corpora (built-in, directories, installed Python source) and holds out documents,
`origin` records where a set's text came from so it can be read again, `teacher` labels positions
with the exact model's next token, `self_distill` has the exact model write text of its own.
Used by the offline build and by compare; the inference runtime does not import it.
"""
