"""indexing tile programs (in progress)."""

from __future__ import annotations
