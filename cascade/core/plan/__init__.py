"""Speculate where it pays: how many drafted tokens a pass takes (goodput), per-position acceptance
estimates, and guessing a round's outcome before its verdict."""
