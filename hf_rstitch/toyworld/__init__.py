"""The toy world: arithmetic word problems, a shared tokenizer, and a trained SLM/LLM pair.

It lets stitching run on real learned distributions offline on a CPU (see docs/toyworld.md).
Importing this package is cheap: torch and transformers load only when a model is built.
"""

from hf_rstitch.toyworld.pair import extract_boxed, grade, load_pair, load_test_split

__all__ = ["extract_boxed", "grade", "load_pair", "load_test_split"]
