"""Generation backends: one small interface (base.Backend), two paths (exact, spatial)."""
