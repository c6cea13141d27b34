"""Tasks, readers, tokenised datasets."""
