"""The server's dialect: which flags a node's SGLang version takes, and a search space's knobs in them.

Flag tables are data files in `autotune/dialect/tables/` (one per SGLang version, written from SGLang's own
parser by `scripts/dump_sglang_flags.py`); a node whose version has no table is read from its `--help`.
This package imports neither Optuna nor Ray: node actors use it.
"""

from autotune.dialect._table import (
    TABLES_DIR,
    Deprecation,
    Flag,
    FlagTable,
    FlagTableError,
    all_committed_tables,
    committed_table,
    committed_versions,
    load_table,
    table_from_help,
    unknown_flag,
)
from autotune.dialect._translate import Dialect, Held, Translation

__all__ = [
    "TABLES_DIR",
    "Deprecation",
    "Dialect",
    "Flag",
    "FlagTable",
    "FlagTableError",
    "Held",
    "Translation",
    "all_committed_tables",
    "committed_table",
    "committed_versions",
    "load_table",
    "table_from_help",
    "unknown_flag",
]
