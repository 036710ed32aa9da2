"""The packed forward pass: many sequences' new tokens through one model call, the batch-invariant
products and attention that give a position the same numbers in any pass, and the ops a
compiled step calls."""
