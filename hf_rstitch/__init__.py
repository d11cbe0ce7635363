"""hf-rstitch: R-Stitch stitched decoding as a transformers generation plugin.

    import hf_rstitch  # registers stitched decoding on GenerationMixin.generate
    out = llm.generate(**inputs, assistant_model=slm, stitch_threshold=0.02)
"""
__version__ = "0.1.0"
