"""Drafter: holds the small model and runs the draft -> verify loop for its sessions."""
