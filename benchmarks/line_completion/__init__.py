"""Repository-level line completion (`hartonomous bench --completion`): held-out files of real
repositories, a line chosen by seed, the file so far as the prompt, every system completing the
line greedily; scored by exact match and edit similarity with intervals over files.

lines (which lines), prompts (where a prompt starts and ends, the budgets), retrieval (the
in-context retrieval baseline), stores (the stores the bench builds and what they hold), metrics
(EM, ES, intervals), run (the systems side by side).
"""
