"""The feature drafter (EAGLE-3 style): a layer on the target's hidden states, its runner and its
token trees."""
