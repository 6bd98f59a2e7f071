"""The features party (the publisher): features, received releases, training."""
