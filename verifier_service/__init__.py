"""Verifier: holds the target model, checks draft blocks, decodes alone when asked (k = 0)."""
