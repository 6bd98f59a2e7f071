"""The labels party (the advertiser): raw labels, the ε budget, randomized releases."""
