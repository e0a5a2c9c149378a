"""The atom set: its typed record, the catalog (load, list, drop, default) and the writer.

Every reader and writer of `atom_sets` goes through this package (the SQL functions read it
too). `projection` builds atom sets with `write_atom_set`; the runtime loads them with
`load_atom_set`.
"""

from hartonomous.atomset.catalog import (atom_set_exists, atom_set_names, drop_atom_set, key_dimensions,
                                         list_atom_sets, load_atom_set, model_name_for, set_default_atom_set,
                                         tokenizer_for)
from hartonomous.atomset.record import (AtomSet, AtomStats, BuildStats, CalibrationStats, ControlStats, CorpusStats,
                                        DistillStats, HoldoutStats, IngestStats, ProjectionStats, SplitStats,
                                        SyntheticStats)
from hartonomous.atomset.write import (ATOM_SOURCES, INDEX_LAYOUT, AtomRows, AtomSetSpec, IngestReport,
                                       LandmarkRows, TokenRows, write_atom_set)

__all__ = [
    "ATOM_SOURCES", "AtomRows", "AtomSet", "AtomSetSpec", "AtomStats", "BuildStats", "CalibrationStats", "ControlStats", "CorpusStats",
    "DistillStats", "HoldoutStats", "INDEX_LAYOUT", "IngestReport", "IngestStats", "LandmarkRows",
    "ProjectionStats", "SplitStats", "SyntheticStats", "TokenRows", "atom_set_exists", "atom_set_names", "drop_atom_set",
    "key_dimensions", "list_atom_sets", "load_atom_set", "model_name_for", "set_default_atom_set", "tokenizer_for",
    "write_atom_set",
]
