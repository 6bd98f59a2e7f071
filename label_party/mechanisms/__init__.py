"""Label randomizers: pure numpy/scipy/highspy functions, no I/O (DESIGN.md §4)."""
