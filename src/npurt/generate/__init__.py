"""Generative decoders: the static-shape form an NPU compiles, derived from the ordinary export (``static_form``)."""
