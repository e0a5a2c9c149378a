"""A store that follows a repository: its files (files), their licenses (license), the indexed set
(index, update), citations back to the files (citations) and following the directory (watch)."""
