"""What both parties import: protocol schemas, codecs, settings, logging."""
