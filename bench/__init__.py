"""Benchmarks: run with ``make bench``; results and write-up in bench/README.md."""
