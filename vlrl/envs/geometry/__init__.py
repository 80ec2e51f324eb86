"""geometry: synthetic triangle diagrams with a ``calc_score`` tool-call oracle (a Geometry3K stand-in)."""
