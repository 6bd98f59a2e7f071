"""LP-MST across the two parties: ``POST /v1/multistage`` (``rr-with-prior-lp-mst.txt``
Algorithm 3, with the supplement's Appendix B enhancements)."""
