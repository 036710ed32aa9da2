"""The speculation memory: an index of finished generations and drafts scored from it."""
