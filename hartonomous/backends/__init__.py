"""Generation backends: the interfaces (base) and the spatial, in-database, exact and hybrid backends.

The speculative and augmented backends live with their paths: hartonomous.speculative.decoding and
hartonomous.augment.backend.
"""
