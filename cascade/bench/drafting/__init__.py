"""Drafting methods on their workloads (`cascade bench memory`, `ngram-copy`, `suffix-lookup`,
`structured`, `cascades`)."""
