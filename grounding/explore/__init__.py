"""The retrieval explorer (``make explore``, ``python -m grounding.explore``): a local web page that puts every
leaderboard model's answers to one query side by side, with why each photo matched. See docs/explore.md."""
