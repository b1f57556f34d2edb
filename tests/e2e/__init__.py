"""End-to-end runs: recipes that must learn, quickstarts, the combination matrix, multi-process and
server training runs (most marked slow)."""
