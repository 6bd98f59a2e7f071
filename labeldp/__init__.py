"""labeldp: the command line and the end-to-end runs that play both parties."""
