from __future__ import annotations

from autotune.cli import main

raise SystemExit(main())
