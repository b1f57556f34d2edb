"""Whole-package tests: the public surface, the shipped recipes, the docs' runnable examples, and the
package's metadata (pyproject.toml, LICENSE, the vLLM entry point); the built wheel itself is checked
end to end by scripts/check_wheel.sh (a step of .ci/run)."""
