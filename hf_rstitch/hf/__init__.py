"""Thin glue to transformers: the ``custom_generate`` callable, the ``generate`` patch, the
output class and the input checks. No routing decision is made here."""
