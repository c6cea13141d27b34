"""Scores, speed and size."""
