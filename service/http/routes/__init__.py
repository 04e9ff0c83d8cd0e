"""Routes, one module per resource; each takes typed dependencies and calls one service function."""
